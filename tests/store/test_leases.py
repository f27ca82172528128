"""Dispatch leases with fencing tokens, and recovery of dispatches whose lease ran out."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from sqlalchemy import select

from store import ApprovedDispatch, StaleLease, Store
from store.commands import DecideApproval
from store.schema import log_head
from tests.store.builders import NOW, REQUIRE_APPROVAL, call_request, outcome

LEASE_S = 30.0
EXPIRED = NOW + timedelta(seconds=LEASE_S + 1)


def test_an_admitted_call_is_dispatched_under_a_lease_with_fencing_token_one(store: Store) -> None:
    call = store.admit(call_request(tool_call_id="tc-1", lease_owner="gw-a", lease_s=LEASE_S)).call

    assert (call.lease_owner, call.lease_token) == ("gw-a", 1)
    assert call.lease_expires_at == NOW + timedelta(seconds=LEASE_S)
    dispatching = store.events(tool_call_id="tc-1")[-1]
    assert dispatching.payload["fencing_token"] == 1 and dispatching.payload["lease_owner"] == "gw-a"


def test_an_outcome_with_a_wrong_token_is_refused_and_nothing_is_recorded(store: Store) -> None:
    store.admit(call_request(tool_call_id="tc-1"))

    with pytest.raises(StaleLease, match="token"):
        store.record_outcome(outcome("tc-1", "completed", now=NOW, token=2))
    assert store.get_call("tc-1").status == "dispatching"


def test_an_expired_lease_nobody_recovered_may_still_record_its_outcome(store: Store) -> None:
    store.admit(call_request(tool_call_id="tc-1", lease_s=LEASE_S))

    call = store.record_outcome(outcome("tc-1", "completed", now=EXPIRED))

    assert call.status == "completed" and call.lease_owner is None and call.lease_token == 1


def test_recovery_declares_an_expired_dispatch_unknown_with_evidence_and_fences_the_old_holder(
    store: Store,
) -> None:
    store.admit(call_request(tool_call_id="tc-1", lease_owner="gw-a", lease_s=LEASE_S))

    recovered = store.with_producer("gw-b").recover_expired(now=EXPIRED)

    assert [c.tool_call_id for c in recovered] == ["tc-1"]
    assert (recovered[0].status, recovered[0].verification_status) == ("result_unknown", "pending")
    event = store.events(tool_call_id="tc-1")[-1]
    assert event.type == "tool_call.result_unknown" and event.producer == "gw-b"
    assert event.payload["error"] == "lease_expired"
    assert event.payload["evidence"]["lease_owner"] == "gw-a"
    assert event.payload["evidence"]["fencing_token"] == 1
    with pytest.raises(StaleLease):
        store.record_outcome(outcome("tc-1", "completed", now=EXPIRED))


def test_recovery_leaves_live_leases_and_settled_calls_alone(store: Store) -> None:
    store.admit(call_request(tool_call_id="live", idempotency_key="k-live", lease_s=3600))
    store.admit(call_request(tool_call_id="done", idempotency_key="k-done", lease_s=LEASE_S))
    store.record_outcome(outcome("done", "completed", now=NOW))
    store.admit(call_request(tool_call_id="waiting", idempotency_key="k-wait", decision=REQUIRE_APPROVAL))

    assert store.recover_expired(now=EXPIRED) == []
    assert store.recover_expired(now=EXPIRED) == []  # and running it again changes nothing
    statuses = {c.tool_call_id: c.status for c in store.list_calls()}
    assert statuses == {"live": "dispatching", "done": "completed", "waiting": "approval_pending"}


def test_recovery_run_twice_records_each_expired_dispatch_once(store: Store) -> None:
    for n in range(3):
        store.admit(call_request(tool_call_id=f"tc-{n}", idempotency_key=f"k-{n}", lease_s=LEASE_S))

    first = store.recover_expired(now=EXPIRED)
    second = store.recover_expired(now=EXPIRED + timedelta(seconds=5))

    assert len(first) == 3 and second == []
    unknowns = [e for e in store.events() if e.type == "tool_call.result_unknown"]
    assert len(unknowns) == 3


def test_an_approved_call_is_dispatched_under_a_new_lease(store: Store) -> None:
    admitted = store.admit(call_request(tool_call_id="tc-1", decision=REQUIRE_APPROVAL)).call
    store.decide_approval(DecideApproval(admitted.approval_id, approve=True, decided_by="bob", now=NOW))

    call = store.dispatch_approved(ApprovedDispatch("tc-1", now=NOW, lease_owner="gw-b", lease_s=LEASE_S))

    assert (call.status, call.lease_owner, call.lease_token) == ("dispatching", "gw-b", 1)
    assert store.recover_expired(now=EXPIRED)[0].tool_call_id == "tc-1"


def test_rebuild_reproduces_leases_and_recovery(store: Store) -> None:
    store.admit(call_request(tool_call_id="tc-1", lease_owner="gw-a", lease_s=LEASE_S))
    store.admit(call_request(tool_call_id="tc-2", idempotency_key="k-2", lease_s=3600))
    store.recover_expired(now=EXPIRED)
    before = {c.tool_call_id: c for c in store.list_calls()}

    store.rebuild()

    assert {c.tool_call_id: c for c in store.list_calls()} == before


def test_sweeps_with_nothing_to_do_do_not_wait_for_the_log_head(store: Store) -> None:
    # A replica paused mid-transaction holds the log head; another replica's idle worker tick must not
    # queue behind it (it would stall every writer that then queues behind the tick).
    store.admit(call_request(idempotency_key="k-live", now=NOW))  # dispatching, lease not expired
    finished: list[object] = []
    with store.engine.connect() as holder, holder.begin():
        holder.execute(select(log_head).with_for_update())  # SQLite: BEGIN IMMEDIATE already holds it

        def sweep() -> None:
            finished.append(store.recover_expired(now=NOW))
            finished.append(store.expire_confirmations(now=NOW))

        worker = threading.Thread(target=sweep, daemon=True)
        worker.start()
        worker.join(timeout=10)
        assert finished == [[], []], "an idle sweep waited for the head lock"
    # With the head free again, an expired lease is still recovered.
    assert [c.status for c in store.recover_expired(now=NOW + timedelta(hours=1))] == ["result_unknown"]
