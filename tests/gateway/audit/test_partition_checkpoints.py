"""A checkpoint of a partitioned log signs every partition's head and the digests of its events since
the last one; verify holds each chain to it, so a partition deleted whole (events and head) or rewritten
and re-sealed is caught and named at its own seq. A log whose partition "" is empty is checkpointed too."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from joserfc import jws
from joserfc.jwk import OKPKey
from sqlalchemy import delete, select, update

from gateway.audit.checkpoints import (
    ALGORITHM,
    TYPE,
    CheckpointSigner,
    parse,
    read_all,
    trusted_keys,
    write_checkpoint,
)
from store import Anchor, Store
from store.canonical import canonical_json
from store.commands import RevokePrincipal
from store.events import GENESIS_HASH, compute_hash, json_for
from store.partitions import Partitioning
from store.schema import events, log_head
from store.security import SecurityNote
from tests.postgres import fresh_store
from tests.store.builders import NOW, call_request, outcome

AT = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def partitioned(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A fresh database of either kind, partitioned by tenant from the start: partition "" is empty."""
    with fresh_store(request, tmp_path, partitioning=Partitioning("tenant")) as (url, opened):
        yield opened


@pytest.fixture
def store(partitioned: Store) -> Store:
    """Partitioned: a security note in "", a call of acme (t:acme) and one of globex (t:globex)."""
    partitioned.record_security(
        [
            SecurityNote(
                type="security.auth_failed",
                kind="expired",
                count=1,
                first_at=NOW,
                last_at=NOW,
                window_s=60,
            )
        ]
    )
    partitioned.admit(call_request(tool_call_id="tc-a", idempotency_key="a"))
    partitioned.admit(call_request(tool_call_id="tc-g", idempotency_key="g", tenant="globex", run_id="run-g"))
    return partitioned


def checkpointed(store: Store, tmp_path: Path) -> list[Anchor]:
    signer = CheckpointSigner.load_or_create(tmp_path / "key.jwk", tmp_path / "trusted.jwks")
    keys = trusted_keys(tmp_path / "trusted.jwks")
    made, _ = write_checkpoint(store, signer, tmp_path / "checkpoints", keys, AT)
    assert {h.partition for h in made.anchor.heads} == {"t:acme", "t:globex"}
    return [c.anchor for c in read_all([tmp_path / "checkpoints"], keys)]


def test_a_checkpoint_signs_every_partitions_head_and_an_intact_log_verifies(
    store: Store, tmp_path: Path
) -> None:
    anchors = checkpointed(store, tmp_path)
    line = next((tmp_path / "checkpoints").glob("*.jws")).read_text().split(".")[1]
    assert "heads" in json.loads(__import__("base64").urlsafe_b64decode(line + "==").decode())

    report = store.verify(anchors)
    assert report.ok, report


def test_a_partition_deleted_whole_is_caught_by_the_checkpoint(store: Store, tmp_path: Path) -> None:
    anchors = checkpointed(store, tmp_path)
    with store.engine.begin() as conn:  # the chain alone cannot see it: no events, no head
        conn.execute(delete(events).where(events.c.partition == "t:globex"))
        conn.execute(delete(log_head).where(log_head.c.partition == "t:globex"))
    assert store.verify().chain_ok

    report = store.verify(anchors)
    assert (report.chain_ok, report.partition, report.problem, report.first_bad_seq) == (
        False,
        "t:globex",
        "truncated",
        1,
    )


def test_a_partition_rewritten_and_resealed_is_caught_by_the_checkpoint(store: Store, tmp_path: Path) -> None:
    anchors = checkpointed(store, tmp_path)
    _reseal_from(store, "t:acme", 1)  # edit acme's first event, re-seal its chain and move its head
    assert store.verify().chain_ok

    report = store.verify(anchors)
    assert (report.chain_ok, report.partition, report.problem) == (False, "t:acme", "rewritten")


def test_the_periodic_checkpointer_counts_the_events_of_every_partition(store: Store, tmp_path: Path) -> None:
    from gateway.audit.checkpointer import Checkpointer

    worker = Checkpointer(
        log=store,
        signer=CheckpointSigner.load_or_create(tmp_path / "key.jwk", tmp_path / "trusted.jwks"),
        directory=tmp_path / "cp",
        trusted=tmp_path / "trusted.jwks",
        clock=lambda: AT,
        every_events=3,
        every_s=3600,
    )
    first = worker.pass_once()
    assert first is not None and worker.pass_once() is None  # idle
    store.admit(call_request(tool_call_id="tc-a2", idempotency_key="a2"))  # 2 events, all in t:acme
    assert worker.pass_once() is None and worker.age_s() is not None
    store.admit(call_request(tool_call_id="tc-a3", idempotency_key="a3"))  # partition "" has not moved
    made = worker.pass_once()

    assert made is not None and made.anchor.seq == first.anchor.seq == 1
    assert {h.partition: h.seq for h in made.anchor.heads}["t:acme"] == 7
    assert store.verify([made.anchor]).ok


def _reseal_from(store: Store, partition: str, pseq: int) -> None:
    """Edit `partition`'s event at `pseq`, re-seal every later one and move its head: an intact chain."""
    with store.engine.begin() as conn:
        rows = [
            dict(r._mapping)
            for r in conn.execute(
                select(events).where(events.c.partition == partition).order_by(events.c.pseq)
            )
        ]
        prev = GENESIS_HASH
        for row in rows:
            envelope = {**row, "payload": json.loads(row["payload"]), "prev_hash": prev}
            if row["pseq"] == pseq:
                envelope["payload"]["tampered"] = True
            envelope["hash"] = compute_hash(envelope)
            payload = json_for(envelope["schema_version"])(envelope["payload"])
            conn.execute(
                update(events)
                .where(events.c.seq == row["seq"])
                .values(payload=payload, prev_hash=prev, hash=envelope["hash"])
            )
            prev = envelope["hash"]
        conn.execute(update(log_head).where(log_head.c.partition == partition).values(last_hash=prev))


def _settle(store: Store, name: str, tenant: str = "acme", run_id: str = "run-1") -> None:
    store.admit(call_request(tool_call_id=name, idempotency_key=name, tenant=tenant, run_id=run_id))
    store.record_outcome(outcome(name, "completed", result={"n": name}, now=NOW))


def test_a_rewrite_in_any_partition_is_named_at_its_own_seq_by_the_digests(
    store: Store, tmp_path: Path
) -> None:
    _settle(store, "tc-a2")  # t:acme: 1-3 then 4-6
    anchors = checkpointed(store, tmp_path)
    acme = next(h for h in anchors[0].heads if h.partition == "t:acme")
    assert (acme.seq, acme.from_seq, len(acme.digests)) == (6, 0, 6)
    _reseal_from(store, "t:acme", 4)
    assert store.verify().chain_ok

    report = store.verify(anchors)

    assert (report.chain_ok, report.partition, report.first_bad_seq, report.problem) == (
        False,
        "t:acme",
        4,
        "rewritten",
    )


def test_each_partitions_digests_start_after_the_seq_the_last_checkpoint_vouched_for(
    store: Store, tmp_path: Path
) -> None:
    checkpointed(store, tmp_path)
    _settle(store, "tc-a2")  # t:acme 4-6; t:globex and "" do not move
    signer = CheckpointSigner.load_or_create(tmp_path / "key.jwk", tmp_path / "trusted.jwks")
    keys = trusted_keys(tmp_path / "trusted.jwks")

    made, _ = write_checkpoint(store, signer, tmp_path / "checkpoints", keys, AT)

    covers = {h.partition: (h.from_seq, h.seq, len(h.digests)) for h in made.anchor.heads}
    assert covers == {"t:acme": (3, 6, 3), "t:globex": (3, 3, 0)}
    assert store.verify(c.anchor for c in read_all([tmp_path / "checkpoints"], keys)).ok
    _reseal_from(store, "t:acme", 5)
    report = store.verify([made.anchor])
    assert (report.partition, report.first_bad_seq, report.problem) == ("t:acme", 5, "rewritten")


def test_a_log_whose_partition_of_no_tenant_is_empty_is_checkpointed_and_verified(
    partitioned: Store, tmp_path: Path
) -> None:
    _settle(partitioned, "tc-a")
    _settle(partitioned, "tc-g", tenant="globex", run_id="run-g")
    signer = CheckpointSigner.load_or_create(tmp_path / "key.jwk", tmp_path / "trusted.jwks")
    keys = trusted_keys(tmp_path / "trusted.jwks")

    made, _ = write_checkpoint(partitioned, signer, tmp_path / "checkpoints", keys, AT)

    assert (made.anchor.seq, made.anchor.log_id) == (0, GENESIS_HASH)
    assert {(h.partition, h.seq, len(h.digests)) for h in made.anchor.heads} == {
        ("t:acme", 4, 4),
        ("t:globex", 4, 4),
    }
    report = partitioned.verify([made.anchor])
    assert report.ok, report
    assert (report.anchored_events, report.unanchored_events) == (8, 0)
    partitioned.record_security([_note()])  # "" gets its first event: the checkpoint named no log there
    assert partitioned.verify([made.anchor]).ok
    _reseal_from(partitioned, "t:globex", 2)
    report = partitioned.verify([made.anchor])
    assert (report.partition, report.first_bad_seq, report.problem) == ("t:globex", 2, "rewritten")


def _note() -> SecurityNote:
    return SecurityNote(
        type="security.auth_failed", kind="expired", count=1, first_at=NOW, last_at=NOW, window_s=60
    )


def test_the_periodic_checkpointer_checkpoints_a_log_whose_partition_of_no_tenant_is_empty(
    partitioned: Store, tmp_path: Path
) -> None:
    from gateway.audit.checkpointer import Checkpointer

    worker = Checkpointer(
        log=partitioned,
        signer=CheckpointSigner.load_or_create(tmp_path / "key.jwk", tmp_path / "trusted.jwks"),
        directory=tmp_path / "cp",
        trusted=tmp_path / "trusted.jwks",
        clock=lambda: AT,
        every_events=1,
        every_s=3600,
    )
    assert worker.pass_once() is None  # nothing at all yet
    _settle(partitioned, "tc-a")

    made = worker.pass_once()

    assert made is not None and made.anchor.seq == 0 and made.anchor.heads[0].seq == 4
    assert worker.pass_once() is None and worker.age_s() == 0.0
    assert partitioned.verify([made.anchor]).ok


def test_a_checkpoint_whose_heads_carry_no_digests_still_verifies(store: Store, tmp_path: Path) -> None:
    # As a Writ before per-partition digests signed it: other partitions' heads as [seq, hash].
    signer = CheckpointSigner.load_or_create(tmp_path / "key.jwk", tmp_path / "trusted.jwks")
    keys = trusted_keys(tmp_path / "trusted.jwks")
    heads = store.partition_heads()
    first = store.event_hashes(0, 1)[0]
    payload = {
        "v": 1,
        "log": first,
        "seq": 1,
        "hash": first,
        "events": 1,
        "at": "2026-12-02T12:00:00.000000Z",
        "from_seq": 0,
        "digests": base64.urlsafe_b64encode(bytes.fromhex(first)[:8]).rstrip(b"=").decode(),
        "writer": "old:1",
        "heads": {name: list(head) for name, head in heads.items() if name},
    }
    key = OKPKey.import_key(json.loads((tmp_path / "key.jwk").read_text()))
    header = {"alg": ALGORITHM, "kid": signer.kid, "typ": TYPE}
    line = jws.serialize_compact(header, canonical_json(payload).encode(), key, algorithms=[ALGORITHM])

    old = parse(line, keys, "old.jws:1").anchor

    assert {(h.partition, h.from_seq, h.digests) for h in old.heads} == {
        ("t:acme", 3, ()),
        ("t:globex", 3, ()),
    }
    assert store.verify([old]).ok
    _reseal_from(store, "t:acme", 1)
    report = store.verify([old])
    assert (report.partition, report.first_bad_seq, report.problem) == ("t:acme", 3, "rewritten")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def bucketed(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A fresh database of either kind, its log partitioned by tenant in 4 buckets."""
    with fresh_store(request, tmp_path, partitioning=Partitioning("tenant", buckets=4)) as (_, opened):
        yield opened


def test_the_heads_of_buckets_with_no_event_yet_are_checkpointed_and_verified(
    bucketed: Store, tmp_path: Path
) -> None:
    # A revocation takes the head of every bucket of its tenant, making those no call has used yet.
    bucketed.admit(call_request(tool_call_id="tc-a", idempotency_key="a", run_id="run-a"))
    bucketed.revoke_principal(RevokePrincipal("acme", "mallory", revoked_by="root", now=NOW))
    with bucketed.engine.begin() as conn:
        heads = {row.partition: row.last_seq for row in conn.execute(select(log_head))}
    assert any(p.startswith("t:acme/") and seq == 0 for p, seq in heads.items())
    signer = CheckpointSigner.load_or_create(tmp_path / "key.jwk", tmp_path / "trusted.jwks")
    keys = trusted_keys(tmp_path / "trusted.jwks")
    write_checkpoint(bucketed, signer, tmp_path / "checkpoints", keys, AT)
    report = bucketed.verify([c.anchor for c in read_all([tmp_path / "checkpoints"], keys)])
    assert report.ok, report

    bucketed.admit(call_request(tool_call_id="tc-b", idempotency_key="b", run_id="run-b"))
    write_checkpoint(bucketed, signer, tmp_path / "checkpoints", keys, AT)
    report = bucketed.verify([c.anchor for c in read_all([tmp_path / "checkpoints"], keys)])
    assert report.ok, report
