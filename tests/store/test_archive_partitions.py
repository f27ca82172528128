"""Archiving a partitioned log: each partition's settled, checkpointed beginning goes to files of its
own; verify and rebuild read every partition's files first, and an archived event edited, deleted,
reordered or re-sealed is named by its partition and its seq there."""

from __future__ import annotations

import gzip
import hashlib
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, func, select, update

from store import Anchor, PartitionClaim, Store
from store.archive import MANIFEST, ArchiveError, Segment, segments
from store.events import GENESIS_HASH, compute_hash
from store.partitions import Partitioning, configure
from store.schema import events, log_head
from store.security import SecurityNote
from tests.store.builders import NOW, REQUIRE_APPROVAL, call_request, outcome
from tests.store.histories import projections

LATER = NOW + timedelta(days=400)


@pytest.fixture
def tenants(store: Store) -> Store:
    """Partitioned by tenant: acme's three settled calls (t:acme, 10 events), globex's two settled calls
    and one waiting for approval (t:globex, 9 events), and a security note (partition "")."""
    configure(store.engine, Partitioning("tenant"))
    store.record_security(
        [
            SecurityNote(
                type="security.auth_failed", kind="expired", count=1, first_at=NOW, last_at=NOW, window_s=60
            )
        ]
    )
    for n in range(1, 4):
        settle(store, f"a{n}", "acme", "run-a")
    for n in range(1, 3):
        settle(store, f"g{n}", "globex", "run-g")
    store.admit(
        call_request(
            tool_call_id="g-open",
            idempotency_key="g-open",
            tenant="globex",
            run_id="run-g",
            decision=REQUIRE_APPROVAL,
        )
    )
    return store


def settle(store: Store, name: str, tenant: str, run_id: str) -> None:
    store.admit(call_request(tool_call_id=name, idempotency_key=name, tenant=tenant, run_id=run_id))
    store.record_outcome(outcome(name, "completed", result={"n": name}, now=NOW))


def upto(store: Store) -> dict[str, int]:
    return {partition: seq for partition, (seq, _) in store.partition_heads().items()}


def archive_all(store: Store, directory: Path, until: dict[str, int] | None = None) -> list[Segment]:
    moved = []
    while (segment := store.archive(directory, upto_seq=until or upto(store), before=LATER)) is not None:
        moved.append(segment)
    return moved


def in_database(store: Store) -> dict[str, tuple[int, int]]:
    with store.engine.connect() as conn:
        rows = conn.execute(
            select(events.c.partition, func.min(events.c.pseq), func.count()).group_by(events.c.partition)
        )
        return {row[0]: (row[1], row[2]) for row in rows}


def test_every_partitions_settled_beginning_is_archived_and_verify_and_rebuild_read_it(
    tenants: Store, tmp_path: Path
) -> None:
    total = sum(upto(tenants).values())
    before = projections(tenants)

    moved = archive_all(tenants, tmp_path)

    assert sorted((s.chain, s.first_seq, s.last_seq) for s in moved) == [
        ("", 1, 1),
        ("t:acme", 1, 10),
        ("t:globex", 1, 7),  # stops before the call still waiting
    ]
    assert in_database(tenants) == {"t:globex": (8, 2)}
    assert {s.file for s in moved} == {
        "log-000000000001-000000000001.jsonl.gz",
        "t%3Aacme-000000000001-000000000010.jsonl.gz",
        "t%3Aglobex-000000000001-000000000007.jsonl.gz",
    }
    report = tenants.verify(archive=tmp_path)
    assert report.ok, report
    assert report.events_checked == total
    without = tenants.verify()
    assert (without.chain_ok, without.partition, without.problem, without.first_bad_seq) == (
        False,
        "",
        "truncated",
        1,
    )
    with pytest.raises(ArchiveError, match="the log in the database starts at seq 2 and no archive"):
        tenants.rebuild()
    assert tenants.rebuild(tmp_path) == total
    assert projections(tenants) == before


def test_archiving_stops_at_each_partitions_checkpointed_seq_and_continues_from_there(
    tenants: Store, tmp_path: Path
) -> None:
    first = archive_all(tenants, tmp_path, {"t:acme": 4, "t:globex": 0})
    assert [(s.chain, s.first_seq, s.last_seq) for s in first] == [("t:acme", 1, 4)]
    settle(tenants, "a4", "acme", "run-a")  # t:acme 11-13

    second = archive_all(tenants, tmp_path, upto(tenants))

    assert [(s.chain, s.first_seq, s.last_seq) for s in segments(tmp_path, "t:acme")] == [
        ("t:acme", 1, 4),
        ("t:acme", 5, 13),
    ]
    assert second[1].prev_hash == first[0].last_hash
    assert tenants.verify(archive=tmp_path).ok


def test_an_archive_of_a_log_of_one_chain_written_before_partitions_still_verifies(
    store: Store, tmp_path: Path
) -> None:
    for n in range(1, 4):
        settle(store, f"c{n}", "acme", "run-1")
    (segment,) = archive_all(store, tmp_path)
    # As the archiver before partitions wrote it: rows without partition and pseq, partition null.
    _rewrite(
        tmp_path,
        segment,
        lambda rows: [{k: v for k, v in r.items() if k not in ("partition", "pseq")} for r in rows],
    )
    assert '"partition":null' in (tmp_path / MANIFEST).read_text()

    report = store.verify(archive=tmp_path)

    assert report.ok, report
    assert store.rebuild(tmp_path) == 10


def test_a_manifest_line_this_writ_cannot_read_is_a_clear_error(tenants: Store, tmp_path: Path) -> None:
    archive_all(tenants, tmp_path)
    with (tmp_path / MANIFEST).open("a") as manifest:
        manifest.write(json.dumps({"file": "x", "format": 9}) + "\n")

    report = tenants.verify(archive=tmp_path)

    assert (report.chain_ok, report.problem) == (False, "edited")
    assert "is not a segment this Writ reads" in (report.detail or "")


# -- tampering with archived events, the manifest's sha256 made to match ----------------------------


def _rows_of(directory: Path, segment: Segment) -> list[dict[str, Any]]:
    text = gzip.decompress((directory / segment.file).read_bytes()).decode()
    return [json.loads(line) for line in text.splitlines()]


def _rewrite(directory: Path, segment: Segment, change: Any) -> None:
    """Rewrite a segment's rows with `change` and re-hash its manifest line, as an attacker would."""
    rows = change(_rows_of(directory, segment))
    data = gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode())
    (directory / segment.file).write_bytes(data)
    manifest = directory / MANIFEST
    manifest.write_text(manifest.read_text().replace(segment.sha256, hashlib.sha256(data).hexdigest()))


def _segment_of(directory: Path, partition: str) -> Segment:
    (found,) = segments(directory, partition)
    return found


def _edited(rows: list[dict[str, Any]], pseq: int) -> list[dict[str, Any]]:
    row = next(r for r in rows if r["pseq"] == pseq)
    row["payload"] = json.dumps({**json.loads(row["payload"]), "tampered": True})
    return rows


def test_an_archived_event_edited_is_named_by_its_partition_and_seq(tenants: Store, tmp_path: Path) -> None:
    archive_all(tenants, tmp_path)
    segment = _segment_of(tmp_path, "t:acme")
    original = (tmp_path / segment.file).read_bytes()
    (tmp_path / segment.file).write_bytes(gzip.compress(b"{}\n"))  # the manifest's sha256 left as it was
    named = tenants.verify(archive=tmp_path)
    assert (named.chain_ok, named.partition, named.first_bad_seq, named.problem) == (
        False,
        "t:acme",
        1,
        "edited",
    )
    assert segment.file in (named.detail or "") and "partition 't:acme'" in (named.detail or "")

    (tmp_path / segment.file).write_bytes(original)
    _rewrite(tmp_path, segment, lambda rows: _edited(rows, 6))

    report = tenants.verify(archive=tmp_path)

    assert (report.chain_ok, report.partition, report.first_bad_seq, report.problem) == (
        False,
        "t:acme",
        6,
        "edited",
    )


def test_an_archived_event_deleted_is_named_by_its_partition_and_seq(tenants: Store, tmp_path: Path) -> None:
    archive_all(tenants, tmp_path)
    _rewrite(tmp_path, _segment_of(tmp_path, "t:globex"), lambda rows: [r for r in rows if r["pseq"] != 5])

    report = tenants.verify(archive=tmp_path)

    assert (report.chain_ok, report.partition, report.first_bad_seq, report.problem) == (
        False,
        "t:globex",
        5,
        "deleted",
    )


def test_archived_events_reordered_are_named_by_their_partition_and_seq(
    tenants: Store, tmp_path: Path
) -> None:
    archive_all(tenants, tmp_path)
    segment = _segment_of(tmp_path, "t:acme")

    def swap_lines(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        rows[3], rows[4] = rows[4], rows[3]
        return rows

    _rewrite(tmp_path, segment, swap_lines)
    lines = tenants.verify(archive=tmp_path)
    assert (lines.partition, lines.first_bad_seq, lines.problem) == ("t:acme", 4, "reordered")

    segment = _segment_of(tmp_path, "t:acme")

    def swap_places(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        rows = sorted(rows, key=lambda r: r["pseq"])
        rows[3]["pseq"], rows[4]["pseq"] = rows[4]["pseq"], rows[3]["pseq"]
        return sorted(rows, key=lambda r: r["pseq"])

    _rewrite(tmp_path, segment, swap_places)
    places = tenants.verify(archive=tmp_path)
    assert (places.partition, places.first_bad_seq, places.problem) == ("t:acme", 4, "reordered")


def _reseal(rows: list[dict[str, Any]], pseq: int) -> list[dict[str, Any]]:
    """Edit the event at `pseq` and re-seal every one after it: each chain link holds again."""
    rows = _edited(rows, pseq)
    prev = rows[0]["prev_hash"]
    for row in rows:
        envelope = {**row, "payload": json.loads(row["payload"]), "prev_hash": prev}
        row["prev_hash"], row["hash"] = prev, compute_hash(envelope)
        prev = row["hash"]
    return rows


def _claims(store: Store) -> Anchor:
    """What a checkpoint made now vouches for: every partition's head and the hash of each of its events."""
    heads = []
    for partition, (seq, last) in sorted(upto_heads(store).items()):
        if partition and seq:
            hashes = store.event_hashes(0, seq, partition)
            heads.append(PartitionClaim(partition, seq, last, 0, tuple(h[:16] for h in hashes)))
    seq, last = upto_heads(store)[""]
    hashes = store.event_hashes(0, seq)
    return Anchor(hashes[0], seq, last, 0, tuple(h[:16] for h in hashes), source="test", heads=tuple(heads))


def upto_heads(store: Store) -> dict[str, tuple[int, str]]:
    return store.partition_heads()


def test_an_archived_event_resealed_is_named_at_its_seq_by_the_checkpoint_of_its_partition(
    tenants: Store, tmp_path: Path
) -> None:
    anchor = _claims(tenants)
    archive_all(tenants, tmp_path)
    segment = _segment_of(tmp_path, "t:acme")  # all of acme: re-sealed to the end, head moved to match
    _rewrite(tmp_path, segment, lambda rows: _reseal(rows, 6))
    last = _rows_of(tmp_path, _segment_of(tmp_path, "t:acme"))[-1]["hash"]
    with tenants.engine.begin() as conn:
        conn.execute(update(log_head).where(log_head.c.partition == "t:acme").values(last_hash=last))
    assert tenants.verify(archive=tmp_path).chain_ok  # the chain alone cannot see it

    report = tenants.verify([anchor], archive=tmp_path)

    assert (report.chain_ok, report.partition, report.first_bad_seq, report.problem) == (
        False,
        "t:acme",
        6,
        "rewritten",
    )


def test_an_archived_event_resealed_up_to_the_database_breaks_the_chain_there(
    tenants: Store, tmp_path: Path
) -> None:
    archive_all(tenants, tmp_path)  # t:globex keeps 8-9 in the database
    _rewrite(tmp_path, _segment_of(tmp_path, "t:globex"), lambda rows: _reseal(rows, 3))

    report = tenants.verify(archive=tmp_path)

    assert (report.chain_ok, report.partition, report.problem) == (False, "t:globex", "broken_chain")
    assert report.first_bad_seq == 7


def test_a_checkpoint_of_a_partitioned_log_anchors_archived_events_too(
    tenants: Store, tmp_path: Path
) -> None:
    anchor = _claims(tenants)
    archive_all(tenants, tmp_path)

    report = tenants.verify([anchor], archive=tmp_path)

    assert report.ok, report
    assert report.anchored_events == sum(upto(tenants).values()) == report.events_checked
    assert report.unanchored_events == 0


def test_genesis_anchor_for_an_empty_unpartitioned_part_names_no_log(tenants: Store) -> None:
    # A checkpoint made while partition "" was empty vouches for nothing there, whatever "" holds later.
    heads = tuple(
        PartitionClaim(p, seq, last, seq) for p, (seq, last) in sorted(upto_heads(tenants).items()) if p
    )
    anchor = Anchor(GENESIS_HASH, 0, GENESIS_HASH, 0, (), source="test", heads=heads)

    report = tenants.verify([anchor])

    assert report.ok, report
    assert report.anchored_seq == 0 and report.anchored_events == 19


def test_each_partition_is_archived_whole_and_a_run_with_nothing_new_visits_none_of_them(
    store: Store, tmp_path: Path
) -> None:
    configure(store.engine, Partitioning("tenant"))
    names = [f"tenant-{n:04d}" for n in range(40)]  # bench/checkpoints.py archives 1,000
    for n, name in enumerate(names):
        settle(store, f"c{n}", name, f"run-{n}")  # t:tenant-NNNN 1-4
    blocked = names[-1]
    store.admit(
        call_request(
            tool_call_id="open",
            idempotency_key="open",
            tenant=blocked,
            run_id="run-39",
            decision=REQUIRE_APPROVAL,
        )
    )  # t:tenant-0039 5-6, waiting for approval
    heads = upto(store)
    total = sum(heads.values())

    moved = list(store.archive_all(tmp_path, upto_seq=heads, before=LATER))

    assert sorted((s.chain, s.first_seq, s.last_seq, s.count) for s in moved) == [
        (f"t:{name}", 1, 4, 4) for name in names
    ]
    assert in_database(store) == {f"t:{blocked}": (5, 2)}
    report = store.verify(archive=tmp_path)
    assert report.ok, report
    assert report.events_checked == total
    named: set[str] = set()

    def note(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        values = parameters.values() if isinstance(parameters, dict) else parameters or ()
        named.update(v for v in values if isinstance(v, str) and v.startswith("t:tenant-"))

    event.listen(store.engine, "before_cursor_execute", note)
    try:
        assert store.archive(tmp_path, upto_seq=heads, before=LATER) is None
    finally:
        event.remove(store.engine, "before_cursor_execute", note)
    assert named == {f"t:{blocked}"}  # the one partition with events its checkpoint vouches for left
