"""A checkpoint of more partitions than one JWS line holds is signed as pages, lines of their own that
are read back as one checkpoint: verify holds every partition to it, the last page's too; a checkpoint
with a page missing is refused, never used in part; checkpoints of one line verify beside them."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from joserfc import jws
from joserfc.jwk import OKPKey

from gateway.audit import pages
from gateway.audit.checkpointer import Checkpointer, announce
from gateway.audit.checkpoints import (
    ALGORITHM,
    TYPE,
    CheckpointSigner,
    CheckpointUnverifiable,
    Cover,
    parse,
    read_all,
    trusted_keys,
    write_checkpoint,
)
from gateway.audit.pages import PAGE_BYTES
from store import Store
from store.canonical import canonical_json
from store.commands import EnqueueOutbox
from store.events import format_ts
from store.partitions import Partitioning
from tests.gateway.audit.test_partition_checkpoints import _reseal_from
from tests.gateway.cli.test_cli_audit import config_for, writ
from tests.postgres import fresh_store
from tests.store.builders import call_request

AT = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
TENANTS = 40
SMALL_PAGE_BYTES = 2_500
"""Pages this small put the heads of `TENANTS` partitions on three or more lines, so that each test
builds 40 partitions instead of the 800 that `PAGE_BYTES` takes (one test builds those)."""
WIDE = 800
JWS_PAYLOAD_BOUND = 128_000
"""joserfc's bound on a compact JWS's base64 payload: what one line of the old form passed."""


def tenant(n: int) -> str:
    return f"tenant-{n:04d}"


def add_partitions(store: Store, tenants: int, prefix: str = "c") -> None:
    """One call admitted in each of `tenants` tenants, in run r<n>: a partition each (t:tenant-NNNN),
    3 events the first time (the run starts), 2 later."""
    for n in range(tenants):
        name = f"{prefix}{n}"
        store.admit(call_request(tool_call_id=name, idempotency_key=name, tenant=tenant(n), run_id=f"r{n}"))


@pytest.fixture
def small_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pages, "PAGE_BYTES", SMALL_PAGE_BYTES)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path, small_pages: None) -> Iterator[Store]:
    """Partitioned by tenant, `TENANTS` partitions of 3 events each, on small pages; partition "" is
    empty."""
    with fresh_store(request, tmp_path, partitioning=Partitioning("tenant")) as (_, opened):
        add_partitions(opened, TENANTS)
        yield opened


def signer_in(tmp_path: Path) -> CheckpointSigner:
    return CheckpointSigner.load_or_create(tmp_path / "key.jwk", tmp_path / "trusted.jwks")


def checkpoint(store: Store, tmp_path: Path, now: datetime = AT) -> Any:
    made, path = write_checkpoint(
        store, signer_in(tmp_path), tmp_path / "cp", trusted_keys(tmp_path / "trusted.jwks"), now
    )
    return made, path


def read(tmp_path: Path) -> list[Any]:
    return read_all([tmp_path / "cp"], trusted_keys(tmp_path / "trusted.jwks"))


def payload(line: str) -> dict[str, Any]:
    part = line.split(".")[1]
    return dict(json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))))


def test_a_checkpoint_of_800_partitions_is_signed_in_pages_under_the_jws_bound_and_verifies(
    tmp_path: Path,
) -> None:
    # Real pages (`PAGE_BYTES`): one line of 800 heads is over joserfc's bound, which the old form
    # failed on (ExceededSizeError). SQLite only: the pages do not depend on the store.
    with Store.open(f"sqlite:///{tmp_path / 'writ.db'}", partitioning=Partitioning("tenant")) as wide:
        wide.migrate()
        add_partitions(wide, WIDE)
        made, path = checkpoint(wide, tmp_path)

        lines = path.read_text().splitlines()
        assert len(lines) == len(made.lines) >= 2
        assert all(len(line.split(".")[1]) <= JWS_PAYLOAD_BOUND for line in lines)
        assert sum(len(line.split(".")[1]) for line in lines) > JWS_PAYLOAD_BOUND  # one line would not do
        signed = [payload(line) for line in lines]
        assert [p["page"] for p in signed] == [[k, len(signed)] for k in range(1, len(signed) + 1)]
        assert len({p["set"] for p in signed}) == 1 and {p["v"] for p in signed} == {2}
        assert sum(len(p["heads"]) for p in signed) == WIDE  # each head on one page
        (found,) = read(tmp_path)
        assert len(found.anchor.heads) == WIDE and found.lines == tuple(lines)
        assert {(h.partition, h.seq, len(h.digests)) for h in found.anchor.heads} == {
            (f"t:{tenant(n)}", 3, 3) for n in range(WIDE)
        }
        report = wide.verify([found.anchor])
        assert report.ok, report
        assert (report.anchored_events, report.unanchored_events) == (3 * WIDE, 0)


def test_small_pages_split_the_heads_of_the_tests_partitions_over_three_lines_or_more(
    store: Store, tmp_path: Path
) -> None:
    made, _ = checkpoint(store, tmp_path)

    assert len(made.lines) >= 3
    assert all(
        len(base64.urlsafe_b64decode(line.split(".")[1] + "==")) <= SMALL_PAGE_BYTES for line in made.lines
    )
    (found,) = read(tmp_path)
    assert len(found.anchor.heads) == TENANTS
    assert store.verify([found.anchor]).ok


def test_a_head_rewritten_in_a_partition_on_the_last_page_is_named_at_its_seq(
    store: Store, tmp_path: Path
) -> None:
    made, _ = checkpoint(store, tmp_path)
    last = f"t:{tenant(TENANTS - 1)}"
    assert last in payload(made.lines[-1])["heads"]
    _reseal_from(store, last, 3)  # its head event edited, its head moved: the chain alone is intact
    assert store.verify().chain_ok

    report = store.verify([c.anchor for c in read(tmp_path)])

    assert (report.chain_ok, report.partition, report.first_bad_seq, report.problem) == (
        False,
        last,
        3,
        "rewritten",
    )


def test_a_checkpoint_with_a_page_missing_is_refused_naming_the_pages_that_are_there(
    store: Store, tmp_path: Path
) -> None:
    checkpoint(store, tmp_path, AT - timedelta(minutes=1))  # older, whole: would anchor every partition
    add_partitions(store, TENANTS, prefix="later")  # each partition's events 4-5
    _, path = checkpoint(store, tmp_path)
    lines = path.read_text().splitlines()
    newest = format_ts(AT)
    first_new = lines.index(next(line for line in lines if payload(line)["at"] == newest))
    last_page = lines.pop()  # the newest checkpoint's last page, cut off the file
    path.write_text("".join(f"{line}\n" for line in lines))

    where = re.escape(f"{path}:{first_new + 1} does not verify")
    with pytest.raises(CheckpointUnverifiable, match=where) as refused:
        read(tmp_path)

    pages = len(lines) - first_new + 1
    assert f"page 1 of {pages} of one checkpoint" in str(refused.value)
    assert f"page {pages} missing" in str(refused.value)
    assert payload(last_page)["page"] == [pages, pages]


def test_pages_read_from_the_webhooks_receiver_as_they_came_assemble_in_any_order(
    store: Store, tmp_path: Path
) -> None:
    made, _ = checkpoint(store, tmp_path)
    sent: list[EnqueueOutbox] = []

    class Outbox:
        def enqueue_outbox(self, cmd: EnqueueOutbox) -> bool:
            sent.append(cmd)
            return True

    assert announce(Outbox(), made, AT)
    notes = [cmd.payload for cmd in sent]
    assert [note["page"] for note in notes] == [[k, len(made.lines)] for k in range(1, len(made.lines) + 1)]
    assert len({cmd.message_id for cmd in sent}) == len(made.lines)
    receiver = tmp_path / "receiver.jws"  # each page appended as it arrived: here, last first
    receiver.write_text("".join(f"{note['checkpoint']}\n" for note in reversed(notes)))

    (found,) = read_all([receiver], trusted_keys(tmp_path / "trusted.jwks"))

    assert found.lines == made.lines and found.anchor.heads == made.anchor.heads
    assert (found.anchor.log_id, found.anchor.seq) == (made.anchor.log_id, made.anchor.seq)
    one = parse(notes[0]["checkpoint"], trusted_keys(tmp_path / "trusted.jwks"), "webhook")
    assert one.page is not None and one.page.number == 1 and len(one.anchor.heads) < TENANTS


def test_the_periodic_checkpointer_writes_pages_and_covers_each_partition_from_its_last_seq(
    store: Store, tmp_path: Path
) -> None:
    clock = [AT]
    worker = Checkpointer(
        log=store,
        signer=signer_in(tmp_path),
        directory=tmp_path / "cp",
        trusted=tmp_path / "trusted.jwks",
        clock=lambda: clock[0],
        every_events=10,
        every_s=3600,
    )
    first = worker.pass_once()
    assert first is not None and len(first.lines) >= 2 and worker.pass_once() is None  # idle
    add_partitions(store, 20, prefix="more")  # 2 events in each of the first 20 partitions
    clock[0] = AT + timedelta(seconds=5)

    second = worker.pass_once()

    assert second is not None  # fewer digests: it may fit one line
    covers = {h.partition: (h.from_seq, h.seq) for h in second.anchor.heads}
    assert covers[f"t:{tenant(0)}"] == (3, 5) and covers[f"t:{tenant(TENANTS - 1)}"] == (3, 3)
    assert [c.lines for c in read(tmp_path)] == [first.lines, second.lines]
    assert store.verify([c.anchor for c in read(tmp_path)]).ok


def test_checkpoints_of_one_line_and_of_pages_verify_side_by_side(tmp_path: Path, small_pages: None) -> None:
    with Store.open(f"sqlite:///{tmp_path / 'writ.db'}", partitioning=Partitioning("tenant")) as small:
        small.migrate()
        add_partitions(small, 3)
        one, _ = checkpoint(small, tmp_path, AT - timedelta(minutes=1))
        assert len(one.lines) == 1 and payload(one.lines[0])["v"] == 1  # as before pages
        add_partitions(small, TENANTS, prefix="later")

        paged, _ = checkpoint(small, tmp_path)

        assert len(paged.lines) >= 2
        found = read(tmp_path)
        assert [len(c.lines) for c in found] == [1, len(paged.lines)]
        assert small.verify([c.anchor for c in found]).ok


def test_a_page_stays_within_its_byte_budget_whatever_the_partitions_names(tmp_path: Path) -> None:
    signer = signer_in(tmp_path)
    heads = {
        f"t:{'ž' * 60}{n:05d}": Cover(1, f"{n:064x}", 0, [f"{n:064x}"]) for n in range(2_000)
    }  # 2-byte characters: the budget counts bytes

    lines = signer.sign(log_id="0" * 64, seq=0, hash_="", from_seq=0, hashes=[], now=AT, heads=heads)

    assert len(lines) >= 4
    assert all(len(base64.urlsafe_b64decode(line.split(".")[1] + "==")) <= PAGE_BYTES for line in lines)
    (found,) = read_all_lines(tmp_path, lines)
    assert {h.partition for h in found.anchor.heads} == set(heads)


def read_all_lines(tmp_path: Path, lines: list[str]) -> list[Any]:
    path = tmp_path / "given.jws"
    path.write_text("".join(f"{line}\n" for line in lines))
    return read_all([path], trusted_keys(tmp_path / "trusted.jwks"))


def test_a_page_after_the_first_that_signs_partition_of_no_tenant_is_refused(tmp_path: Path) -> None:
    signer = signer_in(tmp_path)
    key = OKPKey.import_key(json.loads((tmp_path / "key.jwk").read_text()))
    forged = {
        "v": 2,
        "log": "0" * 64,
        "at": "2026-12-02T12:00:00.000000Z",
        "writer": "w:1",
        "set": "s",
        "page": [2, 2],
        "seq": 5,
        "hash": "1" * 64,
        "heads": {"t:a": [1, "2" * 64]},
    }
    line = jws.serialize_compact(
        {"alg": ALGORITHM, "kid": signer.kid, "typ": TYPE},
        canonical_json(forged).encode(),
        key,
        algorithms=[ALGORITHM],
    )

    with pytest.raises(CheckpointUnverifiable, match='partition "" is signed on page 1 only'):
        parse(line, trusted_keys(tmp_path / "trusted.jwks"), "x:1")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def configured(
    request: pytest.FixtureRequest, tmp_path: Path, small_pages: None
) -> Iterator[tuple[str, Store]]:
    """A config naming a fresh store of either kind partitioned by tenant, with `TENANTS` partitions
    on small pages (the command runs in this process)."""
    with fresh_store(request, tmp_path, partitioning=Partitioning("tenant")) as (url, opened):
        config = config_for(tmp_path, url)
        settings = yaml.safe_load(config.read_text())
        settings["store"]["log"] = {"partition_by": "tenant"}
        config.write_text(yaml.safe_dump(settings))
        add_partitions(opened, TENANTS)
        yield str(config), opened


def test_the_cli_checkpoints_partitions_in_pages_verifies_them_and_refuses_a_page_missing(
    configured: tuple[str, Store], tmp_path: Path
) -> None:
    config, _ = configured

    made = writ("audit", "checkpoint", "-c", config)

    assert made.exit_code == 0, made.output
    assert f"checkpoint at seq 0 and the heads of {TENANTS} other partitions" in made.output
    assert "signed lines (pages)" in made.output
    verified = writ("audit", "verify", "-c", config)
    assert verified.exit_code == 0, verified.output
    assert f"anchored {3 * TENANTS} events across the log's partitions by 1 checkpoint " in verified.output
    (path,) = (tmp_path / "checkpoints").glob("*.jws")
    lines = path.read_text().splitlines()
    path.write_text("".join(f"{line}\n" for line in lines[:-1]))  # the last page lost

    refused = writ("audit", "verify", "-c", config)

    assert refused.exit_code == 1
    assert f"UNVERIFIABLE: checkpoint {path}:1 does not verify: page 1 of {len(lines)}" in refused.output
    assert f"page {len(lines)} missing" in refused.output
    archived = writ("store", "archive", "--to", str(tmp_path / "archive"), "-c", config)
    assert archived.exit_code == 2 and "cannot archive" in archived.output
    assert not (tmp_path / "archive" / "manifest.jsonl").exists()  # nothing moved
