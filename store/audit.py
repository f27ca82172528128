"""Verifying the hash chain: find the first event that was edited, deleted, inserted or reordered."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Row, func, select

from store import events as ev
from store.log import envelope_of, read_pages
from store.model import AuditReport, CorruptEvent
from store.schema import events, log_head

Finding = tuple[str, int, str]
"""(problem, first bad seq, detail)."""


def verify(conn: Connection) -> AuditReport:
    """Walk the whole log in seq order, streaming, and report the first inconsistency."""
    head = conn.execute(
        select(log_head.c.last_seq, log_head.c.last_hash).where(log_head.c.id == 1)
    ).one_or_none()
    if head is None:
        detail = "the log head row (id 1) is missing: the log's length and last hash cannot be checked"
        return AuditReport(False, 0, first_bad_seq=1, problem="head_missing", detail=detail)
    # Every reader pages from seq 1 up (seq > 0), so a row at seq 0 or below would never be walked.
    lowest = conn.execute(select(func.min(events.c.seq))).scalar()
    if isinstance(lowest, int) and lowest < 1:
        detail = f"an event at seq {lowest} lies before the log's first event (seq 1)"
        return AuditReport(False, 0, first_bad_seq=lowest, problem="inserted", detail=detail)
    rows = read_pages(conn)
    expected, prev_hash, checked = 1, ev.GENESIS_HASH, 0
    current = next(rows, None)
    while current is not None:
        following = next(rows, None)
        finding = _check(current, following, expected, prev_hash)
        if finding is not None:
            problem, seq, detail = finding
            return AuditReport(False, checked, first_bad_seq=seq, problem=problem, detail=detail)
        checked += 1
        expected, prev_hash, current = expected + 1, current.hash, following
    last_seq = expected - 1
    if head.last_seq > last_seq:
        detail = f"the head records {head.last_seq} events, the log ends at seq {last_seq}"
        return AuditReport(False, checked, first_bad_seq=last_seq + 1, problem="truncated", detail=detail)
    if head.last_seq < last_seq:
        detail = f"the log continues past the head's seq {head.last_seq}"
        return AuditReport(False, checked, first_bad_seq=head.last_seq + 1, problem="inserted", detail=detail)
    if head.last_hash != prev_hash:
        detail = "the last event's hash differs from the one the head recorded when it was appended"
        return AuditReport(False, checked, first_bad_seq=last_seq, problem="edited", detail=detail)
    return AuditReport(True, checked)


def _check(row: Row[Any], following: Row[Any] | None, expected: int, prev_hash: str) -> Finding | None:
    if row.seq != expected:
        return ("deleted", expected, f"seq {expected} is missing; the next event has seq {row.seq}")
    try:
        envelope = envelope_of(row)
    except CorruptEvent:
        return ("edited", row.seq, f"event {row.seq}'s payload is not JSON")
    try:
        computed = ev.compute_hash(envelope)
    except ValueError:  # NaN, a lone surrogate: nothing Writ appends, so it was put there afterwards
        return ("edited", row.seq, f"event {row.seq}'s content is not JSON that can be hashed")
    if computed != row.hash:
        return _explain_mismatch(row, following, envelope)
    if row.prev_hash != prev_hash:
        # Both events hash correctly on their own, so one was rewritten with a recomputed hash;
        # the earlier one is the first that can no longer be trusted.
        bad = max(row.seq - 1, 1)
        detail = f"event {row.seq} does not link to event {row.seq - 1}: one of them was rewritten"
        return ("broken_chain", bad, detail)
    return None


def _explain_mismatch(row: Row[Any], following: Row[Any] | None, envelope: dict[str, Any]) -> Finding:
    # An event hashes with the seq it was appended at, so a valid hash at a neighbouring seq
    # tells how the event moved rather than merely that it changed.
    seq = row.seq
    if ev.compute_hash({**envelope, "seq": seq - 1}) == row.hash:
        return (
            "inserted",
            seq - 1,
            f"event {seq} was appended at seq {seq - 1}: an event was inserted before it",
        )
    if ev.compute_hash({**envelope, "seq": seq + 1}) == row.hash:
        if following is not None and row.prev_hash == following.hash:
            return ("reordered", seq, f"events {seq} and {seq + 1} were swapped")
        return ("deleted", seq, f"event {seq} was appended at seq {seq + 1}: an event before it was removed")
    return ("edited", seq, f"event {seq}'s content does not match its hash")
