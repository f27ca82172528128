"""Admission: recording intent and decision, and the idempotency key's compare-and-set."""

from __future__ import annotations

from datetime import timedelta

import pytest

from store import Store, StoreError
from tests.store.builders import DENY, NOW, REQUIRE_APPROVAL, call_request, outcome, refusal_request


def types_of(store: Store, tool_call_id: str) -> list[str]:
    return [event.type for event in store.events(tool_call_id=tool_call_id)]


def test_an_allowed_new_call_is_recorded_as_dispatching_and_owned_by_the_caller(store: Store) -> None:
    admission = store.admit(call_request(tool_call_id="tc-1"))

    assert admission.kind == "new"
    assert admission.owns_dispatch
    call = admission.call
    assert (call.status, call.verification_status, call.decision_effect) == (
        "dispatching",
        "not_observed",
        "allow",
    )
    assert call.attempts == 1
    assert call.created_at == NOW and call.created_at.tzinfo is not None
    assert call.arguments == {"order": 1001, "amount": "250.00", "note": "späť"}
    assert [e.type for e in store.events(run_id="run-1")] == [
        "run.started",
        "tool_call.requested",
        "tool_call.dispatching",
    ]
    assert store.find_call_by_key("acme", "alice", "key-1") == call
    assert store.run_call_count("run-1", "acme") == 1


def test_each_event_of_a_call_is_caused_by_the_one_before_it(store: Store) -> None:
    request = call_request(tool_call_id="tc-1")
    store.admit(request)
    store.record_outcome(outcome("tc-1", "completed", result={"isError": False}, now=NOW))

    requested, dispatching, completed = store.events(tool_call_id="tc-1")
    assert requested.causation_id is None
    assert dispatching.causation_id == requested.event_id
    assert completed.causation_id == dispatching.event_id
    correlation_ids = {e.correlation_id for e in (requested, dispatching, completed)}
    assert correlation_ids == {request.identity.correlation_id}


def test_a_second_run_call_does_not_start_the_run_again(store: Store) -> None:
    store.admit(call_request(idempotency_key="k1"))
    store.admit(call_request(idempotency_key="k2"))

    assert [e.type for e in store.events(run_id="run-1")].count("run.started") == 1
    assert store.run_call_count("run-1", "acme") == 2


def test_a_denied_call_records_the_reason_and_is_not_dispatched(store: Store) -> None:
    admission = store.admit(call_request(tool_call_id="tc-1", decision=DENY))

    assert admission.kind == "new" and not admission.owns_dispatch
    assert (admission.call.status, admission.call.reason) == ("denied", "amount_over_limit")
    assert types_of(store, "tc-1") == ["tool_call.requested", "tool_call.denied"]


def test_a_call_needing_approval_is_pending_with_an_awaiting_approval_record(store: Store) -> None:
    request = call_request(tool_call_id="tc-1", decision=REQUIRE_APPROVAL)
    admission = store.admit(request)

    assert admission.call.status == "approval_pending"
    assert admission.call.approval_id == request.approval_id
    approval = store.get_approval(request.approval_id or "")
    assert approval is not None
    assert (approval.status, approval.approver_role, approval.requester) == (
        "awaiting_approval",
        "finance",
        "alice",
    )
    assert approval.expires_at == NOW + timedelta(hours=1)
    assert approval.requester_may_approve is False
    assert [a.approval_id for a in store.list_approvals(status="awaiting_approval")] == [request.approval_id]
    assert types_of(store, "tc-1") == ["tool_call.requested", "approval.required"]


def test_the_same_client_key_and_action_joins_the_recorded_call_without_appending(store: Store) -> None:
    first = store.admit(call_request(tool_call_id="tc-1"))
    before = len(store.events())

    again = store.admit(call_request(tool_call_id="tc-2"))

    assert again.kind == "joined"
    assert again.call == first.call
    assert len(store.events()) == before
    assert store.get_call("tc-2") is None


def test_a_client_key_joins_even_a_failed_call(store: Store) -> None:
    store.admit(call_request(tool_call_id="tc-1"))
    store.record_outcome(outcome("tc-1", "failed", error="boom", now=NOW))

    again = store.admit(call_request(tool_call_id="tc-2", now=NOW + timedelta(days=1)))

    assert (again.kind, again.call.tool_call_id, again.call.status) == ("joined", "tc-1", "failed")


def test_the_same_key_with_a_different_action_is_refused_as_a_conflict(store: Store) -> None:
    store.admit(call_request(tool_call_id="tc-1"))

    conflict = store.admit(call_request(tool_call_id="tc-2", action_hash="action-b"))

    assert conflict.kind == "conflict"
    assert conflict.existing is not None and conflict.existing.tool_call_id == "tc-1"
    assert (conflict.call.tool_call_id, conflict.call.status) == ("tc-2", "denied")
    assert conflict.call.reason == "idempotency_conflict"
    requested, denied = store.events(tool_call_id="tc-2")
    assert requested.payload["claims_key"] is False
    assert denied.payload["existing_tool_call_id"] == "tc-1"
    held = store.find_call_by_key("acme", "alice", "key-1")
    assert held is not None and held.tool_call_id == "tc-1"


def test_a_derived_key_joins_an_in_flight_call(store: Store) -> None:
    store.admit(call_request(tool_call_id="tc-1", key_source="derived"))

    again = store.admit(call_request(tool_call_id="tc-2", key_source="derived", now=NOW + timedelta(hours=5)))

    assert (again.kind, again.call.tool_call_id) == ("joined", "tc-1")


def test_a_derived_key_joins_a_completed_call_inside_the_dedupe_window(store: Store) -> None:
    store.admit(call_request(tool_call_id="tc-1", key_source="derived"))
    store.record_outcome(outcome("tc-1", "completed", result={"ok": 1}, now=NOW))

    again = store.admit(
        call_request(tool_call_id="tc-2", key_source="derived", now=NOW + timedelta(seconds=599))
    )

    assert (again.kind, again.call.tool_call_id, again.call.result) == ("joined", "tc-1", {"ok": 1})


def test_a_derived_key_is_taken_over_after_the_dedupe_window(store: Store) -> None:
    store.admit(call_request(tool_call_id="tc-1", key_source="derived"))
    store.record_outcome(outcome("tc-1", "completed", now=NOW))

    later = store.admit(
        call_request(tool_call_id="tc-2", key_source="derived", now=NOW + timedelta(seconds=600))
    )

    assert later.kind == "new" and later.owns_dispatch
    held = store.find_call_by_key("acme", "alice", "key-1")
    assert held is not None and held.tool_call_id == "tc-2"
    assert store.events(tool_call_id="tc-2")[0].payload["supersedes"] == "tc-1"
    first = store.get_call("tc-1")
    assert first is not None and first.status == "completed"


def test_a_derived_key_is_taken_over_after_a_failure(store: Store) -> None:
    store.admit(call_request(tool_call_id="tc-1", key_source="derived"))
    store.record_outcome(outcome("tc-1", "failed", error="declined", now=NOW))

    retry = store.admit(
        call_request(tool_call_id="tc-2", key_source="derived", now=NOW + timedelta(seconds=1))
    )

    assert (retry.kind, retry.call.status) == ("new", "dispatching")
    held = store.find_call_by_key("acme", "alice", "key-1")
    assert held is not None and held.tool_call_id == "tc-2"


def test_keys_are_scoped_per_tenant(store: Store) -> None:
    store.admit(call_request(tool_call_id="tc-1", run_id="run-a"))

    other = store.admit(
        call_request(tool_call_id="tc-2", tenant="globex", run_id="run-g", action_hash="other")
    )

    assert (other.kind, other.call.status) == ("new", "dispatching")


def test_a_run_of_another_tenant_cannot_be_joined(store: Store) -> None:
    store.admit(call_request(run_id="run-shared"))

    with pytest.raises(StoreError, match="another tenant"):
        store.admit(call_request(tenant="globex", run_id="run-shared", idempotency_key="k-g"))


def test_a_refusal_is_recorded_as_requested_then_denied_without_claiming_the_key(store: Store) -> None:
    call = store.refuse(refusal_request(tool_call_id="tc-bad"))

    assert (call.status, call.reason, call.decision_effect) == ("denied", "invalid_arguments", "deny")
    assert call.error == "order: 'not-a-number' is not of type 'integer'"
    requested, denied = store.events(tool_call_id="tc-bad")
    assert requested.payload["claims_key"] is False
    assert denied.payload["detail"] == call.error
    assert store.find_call_by_key("acme", "alice", "key-bad") is None


def test_naive_datetimes_are_rejected(store: Store) -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        store.admit(call_request(now=NOW.replace(tzinfo=None)))


def test_a_reused_tool_call_id_is_refused_as_a_store_error_not_a_driver_error(store: Store) -> None:
    store.admit(call_request(tool_call_id="tc-1", idempotency_key="k1"))

    with pytest.raises(StoreError, match="constraint") as raised:
        store.admit(call_request(tool_call_id="tc-1", idempotency_key="k2"))

    assert type(raised.value) is StoreError
    assert [e.seq for e in store.events()] == [1, 2, 3]


def test_every_event_names_the_producer_the_store_was_given_and_writ_gateway_by_default(
    store: Store,
) -> None:
    store.admit(call_request(tool_call_id="tc-1"))
    cli = store.with_producer("writ-cli")
    cli.record_outcome(outcome("tc-1", "completed", now=NOW))

    assert (store.producer, cli.producer) == ("writ-gateway", "writ-cli")
    assert [(e.type, e.producer) for e in store.events(tool_call_id="tc-1")] == [
        ("tool_call.requested", "writ-gateway"),
        ("tool_call.dispatching", "writ-gateway"),
        ("tool_call.completed", "writ-cli"),
    ]
