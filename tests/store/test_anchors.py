"""`verify` against anchors (signed checkpoints' contents): a re-sealed rewrite or a truncation that
leaves an intact chain is caught at its first bad seq; events after the newest anchor are counted."""

from __future__ import annotations

from datetime import timedelta

import pytest

from store import Anchor, Store
from tests.store import tamper
from tests.store.builders import DENY, NOW, call_request, outcome

EVENTS = 9


@pytest.fixture
def logged(store: Store) -> Store:
    """A log of nine events: three calls (allowed and completed, denied, allowed)."""
    store.admit(call_request(tool_call_id="tc-1", idempotency_key="k1"))  # seq 1-3
    store.record_outcome(outcome("tc-1", "completed", result={"ok": True}, now=NOW))  # 4
    store.admit(call_request(tool_call_id="tc-2", idempotency_key="k2", decision=DENY))  # 5-6
    store.admit(
        call_request(tool_call_id="tc-3", idempotency_key="k3", now=NOW + timedelta(seconds=1))
    )  # 7-8
    store.record_outcome(outcome("tc-3", "unknown", error="timeout", now=NOW))  # 9
    assert store.log_head()[0] == EVENTS
    return store


def anchor(store: Store, upto: int, from_seq: int = 0, log_id: str | None = None) -> Anchor:
    """What a checkpoint made now at `upto` would vouch for, digests covering (from_seq, upto]."""
    hashes = store.event_hashes(0, upto)
    return Anchor(
        log_id=log_id or hashes[0],
        seq=upto,
        hash=hashes[-1],
        from_seq=from_seq,
        digests=tuple(h[:16] for h in hashes[from_seq:]),
        source=f"test:{upto}",
    )


def test_an_untouched_log_verifies_against_its_anchors_and_counts_what_follows_them(logged: Store) -> None:
    report = logged.verify([anchor(logged, 3), anchor(logged, 6, from_seq=3)])

    assert report.ok, report
    assert (report.anchors_checked, report.anchored_seq, report.unanchored_events) == (2, 6, 3)


def test_without_anchors_every_event_is_unanchored(logged: Store) -> None:
    report = logged.verify()

    assert (report.ok, report.anchors_checked, report.anchored_seq, report.unanchored_events) == (
        True,
        0,
        0,
        EVENTS,
    )


def test_a_rewrite_resealed_to_the_head_is_reported_at_its_seq_under_an_anchor(logged: Store) -> None:
    anchors = [anchor(logged, 8)]
    tamper.rewrite_from(logged, 4)
    assert logged.verify().chain_ok  # the chain alone cannot tell

    report = logged.verify(anchors)

    assert (report.ok, report.problem, report.first_bad_seq) == (False, "rewritten", 4)
    assert "test:8" in (report.detail or "")


def test_a_truncation_with_the_head_moved_back_is_reported_after_the_last_event(logged: Store) -> None:
    anchors = [anchor(logged, 8)]
    tamper.truncate_to(logged, 5)
    assert logged.verify().chain_ok  # the chain alone cannot tell

    report = logged.verify(anchors)

    assert (report.ok, report.problem, report.first_bad_seq) == (False, "truncated", 6)
    assert "test:8" in (report.detail or "")


def test_cutting_events_after_the_newest_anchor_is_not_caught_and_leaves_fewer_unanchored(
    logged: Store,
) -> None:
    anchors = [anchor(logged, 6)]
    tamper.truncate_to(logged, 8)
    logged.rebuild()  # and the projections made to match, as a careful attacker would

    report = logged.verify(anchors)

    assert report.ok, report
    assert (report.anchored_seq, report.unanchored_events) == (6, 2)


def test_a_rewrite_after_the_newest_anchor_is_not_caught(logged: Store) -> None:
    anchors = [anchor(logged, 6)]
    tamper.rewrite_from(logged, 7)

    assert logged.verify(anchors).ok


def test_another_logs_anchor_is_reported_as_foreign(logged: Store) -> None:
    report = logged.verify([anchor(logged, 4, log_id="f" * 64)])

    assert (report.ok, report.problem, report.first_bad_seq) == (False, "foreign_checkpoint", 1)


def test_a_rewrite_before_the_digests_cover_is_reported_at_the_first_covered_seq(logged: Store) -> None:
    anchors = [anchor(logged, 8, from_seq=5)]
    tamper.rewrite_from(logged, 2)

    report = logged.verify(anchors)

    assert (report.ok, report.problem, report.first_bad_seq) == (False, "rewritten", 6)


def test_an_anchor_with_no_digests_still_catches_a_rewrite_by_its_head_hash(logged: Store) -> None:
    full = anchor(logged, 8)
    anchors = [Anchor(full.log_id, 8, full.hash, from_seq=8, digests=(), source="test:bare")]
    tamper.rewrite_from(logged, 3)

    report = logged.verify(anchors)

    assert (report.ok, report.problem, report.first_bad_seq) == (False, "rewritten", 8)


def test_a_log_cut_below_an_anchor_is_truncated_from_the_seq_after_its_last(logged: Store) -> None:
    anchors = [anchor(logged, 2)]
    tamper.truncate_to(logged, 1)

    report = logged.verify(anchors)

    assert (report.problem, report.first_bad_seq) == ("truncated", 2)


def test_event_hashes_reads_a_range_in_seq_order(logged: Store) -> None:
    every = [event.hash for event in logged.events()]

    assert logged.event_hashes(0, EVENTS) == every
    assert logged.event_hashes(3, 5) == every[3:5]
    assert logged.log_head() == (EVENTS, every[-1])
