"""Recording what the executor observed, only while the call is dispatching."""

from __future__ import annotations

from datetime import timedelta

import pytest

from store import DecisionRecord, NotFound, StaleLease, Store
from tests.store.builders import DENY, NOW, REQUIRE_APPROVAL, call_request, outcome

LATER = NOW + timedelta(seconds=2)


def test_a_completed_outcome_stores_the_result_and_leaves_verification_unobserved(store: Store) -> None:
    store.admit(call_request(tool_call_id="tc-1"))
    result = {"content": [{"type": "text", "text": "refunded"}], "structuredContent": None, "isError": False}

    call = store.record_outcome(
        outcome(
            "tc-1", "completed", result=result, external_request_id="ext-9", evidence={"http": 200}, now=LATER
        )
    )

    assert (call.status, call.verification_status, call.result) == ("completed", "not_observed", result)
    assert call.updated_at == LATER
    event = store.events(tool_call_id="tc-1")[-1]
    assert event.type == "tool_call.completed"
    assert event.payload == {"result": result, "external_request_id": "ext-9", "evidence": {"http": 200}}


def test_a_failed_outcome_records_the_error(store: Store) -> None:
    store.admit(call_request(tool_call_id="tc-1"))

    call = store.record_outcome(
        outcome("tc-1", "failed", error="card_declined", detail="402 from backend", now=LATER)
    )

    assert (call.status, call.error, call.result) == ("failed", "card_declined", None)
    assert store.events(tool_call_id="tc-1")[-1].payload["detail"] == "402 from backend"


def test_an_unknown_outcome_is_not_failed_and_awaits_reconciliation(store: Store) -> None:
    store.admit(call_request(tool_call_id="tc-1"))

    call = store.record_outcome(
        outcome("tc-1", "unknown", error="timeout", evidence={"sent": True}, now=LATER)
    )

    assert (call.status, call.verification_status, call.error) == ("result_unknown", "pending", "timeout")
    event = store.events(tool_call_id="tc-1")[-1]
    assert (event.type, event.payload["reconciliation"]) == ("tool_call.result_unknown", "pending")


def test_an_outcome_cannot_be_recorded_twice(store: Store) -> None:
    store.admit(call_request(tool_call_id="tc-1"))
    store.record_outcome(outcome("tc-1", "completed", now=LATER))

    with pytest.raises(StaleLease, match="completed, not dispatching"):
        store.record_outcome(outcome("tc-1", "failed", now=LATER))
    assert len(store.events(tool_call_id="tc-1")) == 3


@pytest.mark.parametrize("decision", [DENY, REQUIRE_APPROVAL], ids=["denied", "approval_pending"])
def test_an_outcome_is_refused_for_a_call_that_was_never_dispatched(
    store: Store, decision: DecisionRecord
) -> None:
    store.admit(call_request(tool_call_id="tc-1", decision=decision))

    with pytest.raises(StaleLease):
        store.record_outcome(outcome("tc-1", "completed", now=LATER))


def test_an_outcome_for_an_unknown_call_is_not_found(store: Store) -> None:
    with pytest.raises(NotFound):
        store.record_outcome(outcome("tc-missing", "completed", now=LATER))
