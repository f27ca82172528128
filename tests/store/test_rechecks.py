"""Re-checks of a `failed` that rests on finding nothing after the commit horizon: scheduled from its
verdict, each under a fenced lease, the verdict standing or contradicted, and nothing due after the last."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from store import CallView, StaleLease, Store, StoreError
from store.commands import (
    RecordContradiction,
    RecordRecheck,
    ResolveReconciliation,
    StartReconciliation,
)
from tests.store.builders import NOW, call_request, outcome

pytestmark = pytest.mark.anyio

SETTLED = NOW + timedelta(seconds=70)
FIRST, SECOND = NOW + timedelta(seconds=130), NOW + timedelta(seconds=250)
SECOND_OF = timedelta(seconds=1)
FOREVER = NOW + timedelta(days=365)


def lease(store: Store, call: CallView, *, method: str, owner: str, now: datetime) -> CallView:
    return store.start_reconciliation(
        StartReconciliation(
            call.tool_call_id,
            expected_token=call.lease_token,
            method=method,
            owner=owner,
            lease_s=30,
            now=now,
        )
    )


def failed_after_horizon(store: Store, recheck_at: datetime | None = FIRST) -> CallView:
    """tc-1: unknown, then settled `failed` by a lookup after its horizon, re-checked from `recheck_at`."""
    store.admit(call_request(tool_call_id="tc-1", idempotency_key="key-1"))
    unknown = store.record_outcome(outcome("tc-1", "unknown", error="response_timeout", now=NOW))
    leased = lease(store, unknown, method="lookup", owner="rec-a", now=SETTLED)
    return store.resolve_reconciliation(
        ResolveReconciliation(
            "tc-1",
            token=leased.lease_token,
            verdict="confirmed_failure",
            evidence={"verdict": "not_found"},
            now=SETTLED,
            recheck_at=recheck_at,
        )
    )


def rechecked(store: Store, call: CallView, next_at: datetime | None, now: datetime) -> CallView:
    return store.record_recheck(
        RecordRecheck(
            "tc-1",
            token=call.lease_token,
            evidence={"verdict": "not_found"},
            next_recheck_at=next_at,
            now=now,
        )
    )


def found(token: int | None, now: datetime) -> RecordContradiction:
    return RecordContradiction(
        "tc-1",
        source="lookup",
        verdict="confirmed_success",
        evidence={"records": 1},
        detail="a re-check found the effect",
        now=now,
        token=token,
    )


def due_ids(store: Store, now: datetime) -> list[str]:
    return [c.tool_call_id for c in store.due_reconciliations(now=now)]


async def test_a_failure_is_due_at_each_recheck_keeps_its_verdict_and_is_due_no_more_after_the_last(
    store: Store,
) -> None:
    failed = failed_after_horizon(store)
    assert (failed.status, failed.verification_status, failed.next_reconcile_at) == (
        "failed",
        "confirmed_failure",
        FIRST,
    )
    assert due_ids(store, FIRST - SECOND_OF) == []
    assert not (await store.due_work_async(now=FIRST - SECOND_OF)).reconciliations
    assert due_ids(store, FIRST) == ["tc-1"]
    assert (await store.due_work_async(now=FIRST)).reconciliations

    first = lease(store, failed, method="recheck", owner="rec-a", now=FIRST)
    # While it looks, the call is what it was: failed, its failure confirmed; leased, so not due.
    assert (first.status, first.verification_status, first.lease_owner) == (
        "failed",
        "confirmed_failure",
        "rec-a",
    )
    assert first.lease_token == failed.lease_token + 1
    assert due_ids(store, FIRST) == []
    after_first = rechecked(store, first, SECOND, FIRST)
    assert (after_first.lease_owner, after_first.next_reconcile_at) == (None, SECOND)
    assert due_ids(store, SECOND - SECOND_OF) == []

    second = lease(store, after_first, method="recheck", owner="rec-b", now=SECOND)
    last = rechecked(store, second, None, SECOND)

    assert (last.status, last.verification_status, last.next_reconcile_at) == (
        "failed",
        "confirmed_failure",
        None,
    )
    assert due_ids(store, FOREVER) == []
    assert not (await store.due_work_async(now=FOREVER)).reconciliations
    with pytest.raises(StaleLease, match="no re-check scheduled"):
        lease(store, last, method="recheck", owner="rec-a", now=FOREVER)
    events = store.events(tool_call_id="tc-1")
    assert [(e.type, e.payload.get("method"), e.payload.get("next_recheck_at")) for e in events[-4:]] == [
        ("reconciliation.started", "recheck", None),
        ("reconciliation.rechecked", None, "2026-11-30T12:04:10.123456Z"),
        ("reconciliation.started", "recheck", None),
        ("reconciliation.rechecked", None, None),
    ]
    assert store.verify().ok  # the grammar holds, and the projections match a replay of the log


def test_a_second_worker_with_the_same_view_loses_the_recheck_lease(store: Store) -> None:
    failed = failed_after_horizon(store)
    lease(store, failed, method="recheck", owner="rec-a", now=FIRST)

    with pytest.raises(StaleLease):
        lease(store, failed, method="recheck", owner="rec-b", now=FIRST)


def test_a_worker_paused_past_its_recheck_lease_records_nothing(store: Store) -> None:
    failed = failed_after_horizon(store)
    paused = lease(store, failed, method="recheck", owner="rec-a", now=FIRST)
    # rec-a pauses past its 30 s lease; rec-b finds the re-check due again and takes it over.
    assert due_ids(store, FIRST + timedelta(seconds=31)) == ["tc-1"]
    taken = lease(store, paused, method="recheck", owner="rec-b", now=FIRST + timedelta(seconds=31))

    with pytest.raises(StaleLease, match="fenced"):
        rechecked(store, paused, SECOND, FIRST + timedelta(seconds=40))
    with pytest.raises(StaleLease, match="fenced"):
        store.record_contradiction(found(paused.lease_token, FIRST + timedelta(seconds=40)))
    assert store.get_call("tc-1").lease_owner == "rec-b"
    rechecked(store, taken, SECOND, FIRST + timedelta(seconds=41))
    assert store.verify().ok


def test_a_recheck_finding_the_effect_contradicts_the_failure_and_ends_the_rechecks(store: Store) -> None:
    failed = failed_after_horizon(store)
    leased = lease(store, failed, method="recheck", owner="rec-a", now=FIRST)

    call = store.record_contradiction(found(leased.lease_token, FIRST))

    assert call is not None
    assert (call.status, call.verification_status, call.contradicted) == ("failed", "inconclusive", True)
    assert (call.lease_owner, call.next_reconcile_at) == (None, None)
    assert due_ids(store, FOREVER) == []
    event = store.events(tool_call_id="tc-1")[-1]
    assert (event.type, event.payload["source"], event.payload["settled_evidence"]) == (
        "reconciliation.contradicted",
        "lookup",
        {"verdict": "not_found"},
    )
    # The lease that found it schedules nothing more, nor records it twice.
    with pytest.raises(StaleLease, match="inconclusive"):
        rechecked(store, leased, SECOND, FIRST)
    with pytest.raises(StaleLease, match="inconclusive"):
        store.record_contradiction(found(leased.lease_token, FIRST))
    assert store.verify().ok


def test_a_late_answer_contradicting_the_failure_meanwhile_fences_the_recheck(store: Store) -> None:
    failed = failed_after_horizon(store)
    leased = lease(store, failed, method="recheck", owner="rec-a", now=FIRST)
    late = RecordContradiction(
        "tc-1",
        source="late_response",
        verdict="confirmed_success",
        evidence={},
        detail="answered late",
        now=FIRST,
    )
    assert store.record_contradiction(late) is not None

    with pytest.raises(StaleLease):
        rechecked(store, leased, SECOND, FIRST)
    assert store.get_call("tc-1").next_reconcile_at is None


def test_only_a_failure_scheduled_for_it_is_rechecked(store: Store) -> None:
    # A failure without a schedule (a backend's own answer, or one settled by hand) is never re-checked.
    unscheduled = failed_after_horizon(store, recheck_at=None)
    assert due_ids(store, FOREVER) == []
    with pytest.raises(StaleLease, match="no re-check scheduled"):
        lease(store, unscheduled, method="recheck", owner="rec-a", now=FIRST)
    # An unknown call is looked up, not re-checked; and a found effect is final, never re-checked.
    store.admit(call_request(tool_call_id="tc-2", idempotency_key="key-2"))
    unknown = store.record_outcome(outcome("tc-2", "unknown", error="response_timeout", now=NOW))
    with pytest.raises(StaleLease, match="result_unknown, not failed"):
        lease(store, unknown, method="recheck", owner="rec-a", now=FIRST)
    leased = lease(store, unknown, method="lookup", owner="rec-a", now=SETTLED)
    with pytest.raises(StoreError, match="only a failure is re-checked"):
        store.resolve_reconciliation(
            ResolveReconciliation(
                "tc-2",
                token=leased.lease_token,
                verdict="confirmed_success",
                evidence={},
                now=SETTLED,
                recheck_at=FIRST,
            )
        )
