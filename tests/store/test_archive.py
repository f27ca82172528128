"""`Store.archive` moves the log's sealed, settled beginning to files; verify and rebuild read them first,
and a file missing or edited is named."""

from __future__ import annotations

import gzip
import hashlib
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from store import Store
from store.archive import MANIFEST, ArchiveError, segments
from store.model import RetryLink, RetryRefused
from store.schema import events
from tests.store.builders import NOW, REQUIRE_APPROVAL, call_request, outcome
from tests.store.histories import projections, record_every_path

LATER = NOW + timedelta(days=400)


def settled_calls(store: Store, count: int, first: int = 1) -> None:
    for n in range(first, first + count):
        store.admit(call_request(tool_call_id=f"tc-{n}", idempotency_key=f"k{n}"))
        store.record_outcome(outcome(f"tc-{n}", "completed", result={"n": n}, now=NOW))


def in_database(store: Store) -> tuple[int | None, int]:
    with store.engine.connect() as conn:
        low, count = conn.execute(select(func.min(events.c.seq), func.count())).one()
    return low, count


def test_archiving_moves_the_settled_beginning_and_verify_reads_the_chain_across_files_and_database(
    store: Store, tmp_path: Path
) -> None:
    settled_calls(store, 3)  # seqs 1-10 (run.started, then 3 events a call)
    store.admit(call_request(tool_call_id="open", idempotency_key="k-open", decision=REQUIRE_APPROVAL))
    settled_calls(store, 2, first=4)
    head_seq, _ = store.log_head()

    segment = store.archive(tmp_path, upto_seq=head_seq, before=LATER)

    assert segment is not None
    assert (segment.first_seq, segment.last_seq, segment.count) == (1, 10, 10)  # stops at the open call
    assert segment.prev_hash == "0" * 64
    assert in_database(store) == (11, head_seq - 10)
    assert store.archive(tmp_path, upto_seq=head_seq, before=LATER) is None  # the open call holds the rest
    report = store.verify(archive=tmp_path)
    assert report.ok, report
    assert report.events_checked == head_seq
    # Every event as stored, arguments and results: its owner's only, as the database is.
    written = [tmp_path / MANIFEST, *tmp_path.glob("*.jsonl.gz")]
    assert len(written) == 2 and {oct(p.stat().st_mode & 0o777) for p in written} == {oct(0o600)}
    without = store.verify()
    assert (without.chain_ok, without.first_bad_seq, without.problem) == (False, 1, "deleted")


def test_archiving_stops_at_the_checkpointed_seq_the_age_and_the_segment_limit(
    store: Store, tmp_path: Path
) -> None:
    settled_calls(store, 4)  # 13 events

    assert store.archive(tmp_path, upto_seq=13, before=NOW) is None  # none is older than NOW
    first = store.archive(tmp_path, upto_seq=9, before=LATER, limit=5)
    second = store.archive(tmp_path, upto_seq=9, before=LATER, limit=5)
    third = store.archive(tmp_path, upto_seq=9, before=LATER, limit=5)

    assert first is not None and second is not None
    assert [(s.first_seq, s.last_seq) for s in segments(tmp_path)] == [(1, 5), (6, 9)]
    assert second.prev_hash == first.last_hash
    assert third is None
    assert in_database(store) == (10, 4)
    assert store.verify(archive=tmp_path).ok


def test_a_missing_archive_file_is_named_and_fails_verify_at_its_first_seq(
    store: Store, tmp_path: Path
) -> None:
    settled_calls(store, 4)
    store.archive(tmp_path, upto_seq=4, before=LATER)
    second = store.archive(tmp_path, upto_seq=10, before=LATER)
    assert second is not None
    (tmp_path / second.file).unlink()

    report = store.verify(archive=tmp_path)

    assert (report.chain_ok, report.first_bad_seq, report.problem) == (False, 5, "deleted")
    assert second.file in (report.detail or "")


def test_an_archive_file_edited_is_named_and_if_its_manifest_is_edited_too_the_chain_names_the_event(
    store: Store, tmp_path: Path
) -> None:
    settled_calls(store, 3)
    segment = store.archive(tmp_path, upto_seq=10, before=LATER)
    assert segment is not None
    path = tmp_path / segment.file
    lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    forged = json.loads(lines[6])  # seq 7, the second call's completion
    forged["payload"] = forged["payload"].replace('"n":2', '"n":20')
    assert forged["payload"] != json.loads(lines[6])["payload"]
    lines[6] = json.dumps(forged)
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))

    edited = store.verify(archive=tmp_path)
    assert (edited.chain_ok, edited.first_bad_seq, edited.problem) == (False, 1, "edited")
    assert segment.file in (edited.detail or "")

    manifest = tmp_path / MANIFEST
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    manifest.write_text(manifest.read_text().replace(segment.sha256, digest))
    resealed = store.verify(archive=tmp_path)
    assert (resealed.chain_ok, resealed.first_bad_seq, resealed.problem) == (False, 7, "edited")


def test_rebuild_after_archiving_reads_the_archive_first_and_refuses_without_it(
    store: Store, tmp_path: Path
) -> None:
    record_every_path(store)
    head_seq, _ = store.log_head()
    before = projections(store)
    moved = store.archive(tmp_path, upto_seq=head_seq, before=LATER + timedelta(days=3650))
    assert moved is not None and moved.count > 10

    with pytest.raises(ArchiveError, match="--archive"):
        store.rebuild()
    assert store.rebuild(tmp_path) == head_seq

    assert projections(store) == before
    assert store.verify(archive=tmp_path).ok


def test_a_run_that_died_after_writing_its_file_is_completed_by_the_next(
    store: Store, tmp_path: Path
) -> None:
    settled_calls(store, 3)
    segment = store.archive(tmp_path, upto_seq=7, before=LATER)
    assert segment is not None
    with store.engine.begin() as conn:  # as if the deletion had not committed
        rows = _archived_rows(tmp_path / segment.file)
        conn.execute(events.insert(), [r | {"partition": "", "pseq": r["seq"]} for r in rows])
    assert in_database(store) == (1, 10)
    assert store.verify(archive=tmp_path).ok  # the leftovers are the file's events: not read twice

    store.archive(tmp_path, upto_seq=10, before=LATER)

    assert in_database(store) == (None, 0)
    assert [(s.first_seq, s.last_seq) for s in segments(tmp_path)] == [(1, 7), (8, 10)]
    assert store.verify(archive=tmp_path).ok


def test_a_new_archive_directory_is_its_owners_only(store: Store, tmp_path: Path) -> None:
    settled_calls(store, 3)
    store.archive(tmp_path / "archive", upto_seq=10, before=LATER)
    assert (tmp_path / "archive").stat().st_mode & 0o777 == 0o700


def test_an_event_put_back_in_the_database_at_an_archived_seq_must_be_the_archived_one(
    store: Store, tmp_path: Path
) -> None:
    # The walk reads archived seqs from the file, so a row there in the database was read by no one:
    # `writ audit export` would publish a forged one while verify passed.
    settled_calls(store, 3)
    segment = store.archive(tmp_path, upto_seq=10, before=LATER)
    assert segment is not None and in_database(store) == (None, 0)
    archived = {
        r["seq"]: r | {"partition": "", "pseq": r["seq"]} for r in _archived_rows(tmp_path / segment.file)
    }
    completion = archived[7]  # the second call's completion, its hash kept
    forged = completion | {"payload": completion["payload"].replace('"n":2', '"n":20')}
    assert forged["payload"] != completion["payload"]
    with store.engine.begin() as conn:
        conn.execute(events.insert(), [archived[6], forged])

    report = store.verify(archive=tmp_path)

    assert (report.chain_ok, report.first_bad_seq, report.problem) == (False, 7, "edited")
    assert "not the event the archive holds" in (report.detail or "")
    with store.engine.begin() as conn:  # the archived event itself, put back: as a died run leaves it
        conn.execute(events.delete().where(events.c.seq == 7))
        conn.execute(events.insert(), [completion])
    assert store.verify(archive=tmp_path).ok


def _archived_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in gzip.decompress(path.read_bytes()).decode().splitlines()]


def test_a_failed_call_whose_events_are_archived_is_not_retried(store: Store, tmp_path: Path) -> None:
    # Whether it was retried before is in its events: with them archived, a second retry could slip by.
    store.admit(call_request(tool_call_id="failed", idempotency_key="k-f"))
    store.record_outcome(outcome("failed", "failed", error="no", now=NOW))
    store.archive(tmp_path, upto_seq=4, before=LATER)
    link = RetryLink("failed", 1, "carol", "card fixed", break_glass=False, same_key=False)

    with pytest.raises(RetryRefused, match="archived") as refused:
        store.admit(call_request(tool_call_id="retry", idempotency_key="k-r", retry=link))
    assert refused.value.reason == "not_found"
