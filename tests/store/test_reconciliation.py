"""Settling unknown outcomes: a leased lookup, its verdicts, backoff, escalation, retries and humans."""

from __future__ import annotations

from datetime import timedelta

import pytest

from store import CallView, StaleLease, Store, StoreError
from store.commands import (
    EscalateReconciliation,
    RecordContradiction,
    RecordInconclusive,
    Redispatch,
    ResolveManually,
    ResolveReconciliation,
    StartReconciliation,
)
from tests.store.builders import NOW, call_request, outcome

LATER = NOW + timedelta(seconds=5)
RESULT = {"content": [], "structuredContent": {"refund_id": "r1"}, "isError": False}


def unknown_call(store: Store, tool_call_id: str = "tc-1", key: str = "key-1") -> CallView:
    store.admit(call_request(tool_call_id=tool_call_id, idempotency_key=key))
    return store.record_outcome(outcome(tool_call_id, "unknown", error="response_timeout", now=NOW))


def start(store: Store, call: CallView, owner: str = "rec-a", now=LATER) -> CallView:
    return store.start_reconciliation(
        StartReconciliation(
            call.tool_call_id,
            expected_token=call.lease_token,
            method="lookup",
            owner=owner,
            lease_s=30,
            now=now,
        )
    )


def test_an_unknown_call_is_due_for_reconciliation_at_once(store: Store) -> None:
    call = unknown_call(store)

    assert [c.tool_call_id for c in store.due_reconciliations(now=NOW)] == [call.tool_call_id]


def test_starting_reconciliation_takes_a_lease_with_a_newer_token_and_hides_the_call(store: Store) -> None:
    call = unknown_call(store)

    leased = start(store, call)

    assert (leased.lease_owner, leased.lease_token, leased.reconcile_attempts) == ("rec-a", 2, 1)
    assert store.due_reconciliations(now=LATER) == []
    assert store.events(tool_call_id="tc-1")[-1].type == "reconciliation.started"


def test_a_second_reconciler_with_the_same_view_loses_the_race(store: Store) -> None:
    call = unknown_call(store)
    start(store, call, owner="rec-a")

    with pytest.raises(StaleLease):
        start(store, call, owner="rec-b")


def test_confirmed_success_completes_the_call_with_the_found_result_and_separate_verification(
    store: Store,
) -> None:
    leased = start(store, unknown_call(store))

    call = store.resolve_reconciliation(
        ResolveReconciliation(
            "tc-1",
            token=leased.lease_token,
            verdict="confirmed_success",
            result=RESULT,
            evidence={"lookup": "/refunds?idempotency_key=key-1"},
            now=LATER,
        )
    )

    assert (call.status, call.verification_status, call.result) == ("completed", "confirmed_success", RESULT)
    assert call.lease_owner is None
    assert [e.type for e in store.events(tool_call_id="tc-1")][-2:] == [
        "reconciliation.started",
        "reconciliation.resolved",
    ]


def test_confirmed_failure_fails_the_call(store: Store) -> None:
    leased = start(store, unknown_call(store))

    call = store.resolve_reconciliation(
        ResolveReconciliation(
            "tc-1", token=leased.lease_token, verdict="confirmed_failure", evidence={"records": 0}, now=LATER
        )
    )

    assert (call.status, call.verification_status) == ("failed", "confirmed_failure")


def test_the_dispatcher_cannot_record_after_reconciliation_took_over(store: Store) -> None:
    call = unknown_call(store)
    leased = start(store, call)

    with pytest.raises(StaleLease):
        store.resolve_reconciliation(
            ResolveReconciliation(
                "tc-1", token=call.lease_token, verdict="confirmed_failure", evidence={}, now=LATER
            )
        )
    assert store.get_call("tc-1").lease_token == leased.lease_token


def test_an_inconclusive_lookup_backs_off_until_its_next_attempt(store: Store) -> None:
    leased = start(store, unknown_call(store))
    retry_at = LATER + timedelta(seconds=10)

    store.record_inconclusive(
        RecordInconclusive(
            "tc-1",
            token=leased.lease_token,
            evidence={"error": "ConnectError"},
            next_attempt_at=retry_at,
            now=LATER,
        )
    )

    assert store.due_reconciliations(now=retry_at - timedelta(seconds=1)) == []
    again = store.due_reconciliations(now=retry_at)
    assert [c.tool_call_id for c in again] == ["tc-1"]
    second = start(store, again[0], now=retry_at)
    assert second.reconcile_attempts == 2 and second.lease_token == 3


def test_an_escalated_call_waits_for_a_human_and_is_no_longer_due(store: Store) -> None:
    leased = start(store, unknown_call(store))

    call = store.escalate_reconciliation(
        EscalateReconciliation(
            "tc-1", token=leased.lease_token, reason="inconclusive_after_retries", now=LATER
        )
    )

    assert (call.status, call.verification_status, call.escalated) == ("result_unknown", "inconclusive", True)
    assert store.due_reconciliations(now=LATER + timedelta(hours=1)) == []


def test_a_human_resolves_an_escalated_call_and_is_recorded_as_who(store: Store) -> None:
    leased = start(store, unknown_call(store))
    store.escalate_reconciliation(
        EscalateReconciliation("tc-1", token=leased.lease_token, reason="no_lookup", now=LATER)
    )

    call = store.resolve_manually(
        ResolveManually(
            "tc-1", succeeded=True, evidence="refund r1 seen in the bank statement", by="carol", now=LATER
        )
    )

    assert (call.status, call.verification_status, call.resolved_by) == (
        "completed",
        "confirmed_success",
        "carol",
    )
    event = store.events(tool_call_id="tc-1")[-1]
    assert event.payload["resolved_by"] == "carol"
    assert event.payload["evidence"] == {"manual": "refund r1 seen in the bank statement"}


def test_a_human_cannot_resolve_another_tenants_call_without_evidence_or_agree_with_a_settled_one(
    store: Store,
) -> None:
    unknown_call(store)
    with pytest.raises(StoreError):
        store.resolve_manually(ResolveManually("tc-1", succeeded=False, evidence=" ", by="carol", now=LATER))
    with pytest.raises(StoreError):
        store.resolve_manually(
            ResolveManually("tc-1", succeeded=False, evidence="x", by="carol", now=LATER, tenant="other")
        )
    store.resolve_manually(
        ResolveManually("tc-1", succeeded=False, evidence="no refund at the bank", by="carol", now=LATER)
    )
    with pytest.raises(StaleLease):  # agreeing with a settled verdict records nothing
        store.resolve_manually(
            ResolveManually("tc-1", succeeded=False, evidence="me neither", by="dave", now=LATER)
        )


def test_a_human_resolution_fences_a_reconciler_still_holding_its_lease(store: Store) -> None:
    leased = start(store, unknown_call(store))
    store.resolve_manually(
        ResolveManually("tc-1", succeeded=False, evidence="checked by phone", by="carol", now=LATER)
    )

    with pytest.raises(StaleLease):
        store.resolve_reconciliation(
            ResolveReconciliation(
                "tc-1", token=leased.lease_token, verdict="confirmed_success", evidence={}, now=LATER
            )
        )


def test_a_retry_to_a_deduplicating_backend_is_recorded_as_attempt_two_under_a_new_token(
    store: Store,
) -> None:
    leased = start(store, unknown_call(store))

    retry = store.redispatch(
        Redispatch("tc-1", token=leased.lease_token, owner="rec-a", lease_s=30, now=LATER)
    )

    assert (retry.status, retry.attempts, retry.lease_token) == ("dispatching", 2, 3)
    dispatching = store.events(tool_call_id="tc-1")[-1]
    assert dispatching.type == "tool_call.dispatching"
    assert dispatching.payload["attempt"] == 2 and dispatching.payload["retry_of_attempt"] == 1
    with pytest.raises(StaleLease):
        store.record_outcome(outcome("tc-1", "completed", now=LATER))
    done = store.record_outcome(outcome("tc-1", "completed", result=RESULT, now=LATER, token=3))
    assert done.status == "completed"


def failed_by_lookup(store: Store, tool_call_id: str = "tc-1", key: str = "key-1") -> CallView:
    leased = start(store, unknown_call(store, tool_call_id, key))
    evidence = {"verdict": "not_found", "horizon_at": "2026-01-01T00:00:00Z"}
    return store.resolve_reconciliation(
        ResolveReconciliation(
            tool_call_id, token=leased.lease_token, verdict="confirmed_failure", evidence=evidence, now=LATER
        )
    )


def test_a_failure_found_by_lookup_says_so_in_its_error(store: Store) -> None:
    assert failed_by_lookup(store).error == "no_effect_after_horizon"


def test_a_later_lookup_finding_the_effect_contradicts_a_failure_without_overwriting_it(store: Store) -> None:
    failed_by_lookup(store)

    call = store.record_contradiction(
        RecordContradiction(
            "tc-1",
            source="lookup",
            verdict="confirmed_success",
            evidence={"records": 1, "refund_id": "r1"},
            detail="the refund was found after all",
            now=LATER + timedelta(seconds=60),
        )
    )

    assert call is not None
    assert (call.status, call.verification_status, call.contradicted, call.unresolved) == (
        "failed",
        "inconclusive",
        True,
        True,
    )
    event = store.events(tool_call_id="tc-1")[-1]
    assert event.type == "reconciliation.contradicted"
    assert event.payload["settled_status"] == "failed"
    assert event.payload["settled_verification"] == "confirmed_failure"
    assert event.payload["settled_evidence"] == {"verdict": "not_found", "horizon_at": "2026-01-01T00:00:00Z"}
    assert (event.payload["verdict"], event.payload["evidence"]) == (
        "confirmed_success",
        {"records": 1, "refund_id": "r1"},
    )
    assert [c.tool_call_id for c in store.list_calls(unresolved=True)] == ["tc-1"]
    assert store.due_reconciliations(now=LATER + timedelta(hours=1)) == []  # a person decides now


def test_evidence_that_agrees_or_a_call_not_yet_settled_records_no_contradiction(store: Store) -> None:
    failed_by_lookup(store)
    unknown_call(store, "tc-2", "key-2")

    agrees = store.record_contradiction(
        RecordContradiction(
            "tc-1", source="lookup", verdict="confirmed_failure", evidence={}, detail=None, now=LATER
        )
    )
    unsettled = store.record_contradiction(
        RecordContradiction(
            "tc-2", source="late_response", verdict="confirmed_success", evidence={}, detail=None, now=LATER
        )
    )

    assert agrees is None and unsettled is None
    assert store.list_calls(unresolved=True)[0].tool_call_id == "tc-2"  # unknown only
    assert len(store.list_calls(unresolved=True)) == 1


def test_a_person_disagreeing_with_a_settled_verdict_contradicts_it_and_then_settles_it(store: Store) -> None:
    failed_by_lookup(store)

    contradicted = store.resolve_manually(
        ResolveManually(
            "tc-1", succeeded=True, evidence="refund r1 in the bank statement", by="carol", now=LATER
        )
    )
    settled = store.resolve_manually(
        ResolveManually(
            "tc-1", succeeded=True, evidence="checked with acme: r1 is real", by="dave", now=LATER
        )
    )

    assert (contradicted.status, contradicted.verification_status) == ("failed", "inconclusive")
    contradiction = store.events(tool_call_id="tc-1")[-2]
    assert (contradiction.type, contradiction.payload["source"], contradiction.payload["by"]) == (
        "reconciliation.contradicted",
        "resolution",
        "carol",
    )
    assert (settled.status, settled.verification_status, settled.resolved_by) == (
        "completed",
        "confirmed_success",
        "dave",
    )
    assert store.list_calls(unresolved=True) == []


def test_an_identical_keyless_call_joins_a_contradicted_failure_instead_of_acting_again(store: Store) -> None:
    failed_by_lookup(store)
    store.record_contradiction(
        RecordContradiction(
            "tc-1", source="lookup", verdict="confirmed_success", evidence={}, detail=None, now=LATER
        )
    )
    again = call_request(tool_call_id="tc-2", idempotency_key="key-1", key_source="derived", now=LATER)

    admission = store.admit(again)

    assert (admission.kind, admission.call.tool_call_id) == ("joined", "tc-1")


def test_rebuild_reproduces_every_reconciliation_state(store: Store) -> None:
    resolved = start(store, unknown_call(store, "tc-1", "k1"))
    store.resolve_reconciliation(
        ResolveReconciliation(
            "tc-1",
            token=resolved.lease_token,
            verdict="confirmed_success",
            result=RESULT,
            evidence={},
            now=LATER,
        )
    )
    backing_off = start(store, unknown_call(store, "tc-2", "k2"))
    store.record_inconclusive(
        RecordInconclusive(
            "tc-2",
            token=backing_off.lease_token,
            evidence={},
            next_attempt_at=LATER + timedelta(seconds=9),
            now=LATER,
        )
    )
    escalated = start(store, unknown_call(store, "tc-3", "k3"))
    store.escalate_reconciliation(
        EscalateReconciliation("tc-3", token=escalated.lease_token, reason="gave_up", now=LATER)
    )
    store.resolve_manually(
        ResolveManually("tc-3", succeeded=False, evidence="none at the bank", by="carol", now=LATER)
    )
    start(store, unknown_call(store, "tc-4", "k4"))  # leased right now
    failed_by_lookup(store, "tc-5", "k5")
    store.record_contradiction(
        RecordContradiction(
            "tc-5", source="lookup", verdict="confirmed_success", evidence={}, detail=None, now=LATER
        )
    )
    before = {c.tool_call_id: c for c in store.list_calls()}

    store.rebuild()

    assert {c.tool_call_id: c for c in store.list_calls()} == before
    assert store.verify().ok
