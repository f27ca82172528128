"""The approval leg: decide or expire an awaiting approval, then dispatch or refuse the approved call."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
from alembic import command

from store import ApprovedDenial, ApprovedDispatch, NotFound, StaleLease, Store, StoreError
from store.commands import DecideApproval, ExpireApproval
from store.model import ApprovalNeed, RetryLink
from tests.store.builders import DENY, NOW, REQUIRE_APPROVAL, call_request, outcome

SOON = NOW + timedelta(minutes=5)


def pending(store: Store, **changes: object) -> str:
    request = call_request(tool_call_id="tc-1", decision=REQUIRE_APPROVAL, **changes)
    store.admit(request)
    assert request.approval_id is not None
    return request.approval_id


def test_a_granted_approval_lets_exactly_one_worker_dispatch_the_call(store: Store) -> None:
    approval_id = pending(store)

    approval = store.decide_approval(
        DecideApproval(approval_id, approve=True, decided_by="bob", reason="ok", now=SOON)
    )
    assert (approval.status, approval.decided_by, approval.decided_at) == ("approved", "bob", SOON)
    call = store.get_call("tc-1")
    assert call is not None and call.status == "approved"

    dispatched = store.dispatch_approved(ApprovedDispatch("tc-1", now=SOON, policy_version="8"))
    assert (dispatched.status, dispatched.attempts) == ("dispatching", 1)
    assert store.events(tool_call_id="tc-1")[-1].policy_version == "8"
    with pytest.raises(StaleLease):
        store.dispatch_approved(ApprovedDispatch("tc-1", now=SOON))
    done = store.record_outcome(outcome("tc-1", "completed", now=SOON))
    assert done.status == "completed"
    assert [e.type for e in store.events(tool_call_id="tc-1")] == [
        "tool_call.requested",
        "approval.required",
        "approval.granted",
        "tool_call.dispatching",
        "tool_call.completed",
    ]


def test_a_rejected_approval_rejects_the_call(store: Store) -> None:
    approval_id = pending(store)

    approval = store.decide_approval(
        DecideApproval(approval_id, approve=False, decided_by="bob", reason="no", now=SOON)
    )

    assert (approval.status, approval.reason) == ("rejected", "no")
    call = store.get_call("tc-1")
    assert call is not None and call.status == "rejected"
    with pytest.raises(StaleLease):
        store.dispatch_approved(ApprovedDispatch("tc-1", now=SOON))


@pytest.mark.parametrize("approve", [True, False], ids=["granted", "rejected"])
def test_a_decision_records_its_break_glass_mark_and_the_deciders_roles_together(
    store: Store, approve: bool
) -> None:
    approval_id = pending(store)

    store.decide_approval(
        DecideApproval(
            approval_id,
            approve=approve,
            decided_by="operator:root@pod",
            reason="idp down",
            now=SOON,
            break_glass=True,
            decided_by_roles=["approver", "admin"],
        )
    )

    decided = store.events(tool_call_id="tc-1")[-1]
    assert decided.type == ("approval.granted" if approve else "approval.rejected")
    assert (decided.payload["break_glass"], decided.payload["decided_by_roles"]) == (
        True,
        ["admin", "approver"],
    )


def test_an_approval_is_decided_only_once(store: Store) -> None:
    approval_id = pending(store)
    store.decide_approval(DecideApproval(approval_id, approve=False, decided_by="bob", now=SOON))

    with pytest.raises(StaleLease, match="already rejected"):
        store.decide_approval(DecideApproval(approval_id, approve=True, decided_by="carol", now=SOON))


def test_the_requester_may_not_approve_their_own_call_unless_allowed(store: Store) -> None:
    approval_id = pending(store)

    with pytest.raises(StoreError, match="may not approve"):
        store.decide_approval(DecideApproval(approval_id, approve=True, decided_by="alice", now=SOON))


def retry_awaiting(store: Store, by: str, n: int = 1, *, requester_may_approve: bool = False) -> str:
    """alice's call `orig-N` failed, retried by `by` as `re-N`, which waits for an approver."""
    store.admit(call_request(tool_call_id=f"orig-{n}", idempotency_key=f"key-{n}"))
    store.record_outcome(outcome(f"orig-{n}", "failed", now=NOW, error="backend said no"))
    need = ApprovalNeed("finance", 3600, requester_may_approve)
    request = call_request(
        tool_call_id=f"re-{n}",
        idempotency_key=f"key-{n}:retry-1",
        decision=dataclasses.replace(REQUIRE_APPROVAL, approval=need),
        retry=RetryLink(f"orig-{n}", 1, by, "order fixed", break_glass=False, same_key=False),
        approval_id=f"ap-re-{n}",
        approval_expires_at=NOW + timedelta(hours=1),
    )
    store.admit(request)
    return f"ap-re-{n}"


def test_whoever_asked_for_a_retry_may_not_approve_it_and_nothing_is_recorded(store: Store) -> None:
    approval_id = retry_awaiting(store, by="bob")
    before = [e.type for e in store.events(tool_call_id="re-1")]

    with pytest.raises(StoreError, match="bob asked for retry re-1 and may not approve it"):
        store.decide_approval(DecideApproval(approval_id, approve=True, decided_by="bob", now=SOON))

    assert [e.type for e in store.events(tool_call_id="re-1")] == before
    approval = store.get_approval(approval_id)
    assert approval is not None and approval.status == "awaiting_approval"


def test_a_retry_is_approved_by_someone_else_and_may_be_rejected_by_its_asker(store: Store) -> None:
    approved, rejected = retry_awaiting(store, by="bob"), retry_awaiting(store, by="bob", n=2)

    by_carol = store.decide_approval(DecideApproval(approved, approve=True, decided_by="carol", now=SOON))
    by_bob = store.decide_approval(DecideApproval(rejected, approve=False, decided_by="bob", now=SOON))

    assert (by_carol.status, by_carol.decided_by) == ("approved", "carol")
    assert (by_bob.status, by_bob.decided_by) == ("rejected", "bob")
    report = store.verify()
    assert report.ok, report


def test_a_retrys_asker_approves_it_where_the_policy_lets_a_requester_approve(store: Store) -> None:
    approval_id = retry_awaiting(store, by="bob", requester_may_approve=True)

    approval = store.decide_approval(DecideApproval(approval_id, approve=True, decided_by="bob", now=SOON))

    assert approval.status == "approved"


def test_who_asked_for_a_retry_is_read_from_the_log(store: Store) -> None:
    retry_awaiting(store, by="bob")

    assert store.retry_requested_by("re-1") == "bob"
    assert store.retry_requested_by("orig-1") is None  # a first call: nobody asked to re-run it
    assert store.retry_requested_by("no-such-call") is None
    assert store.retry_requested_by("bad\x00id") is None  # no row can hold it: nothing asked


def test_an_approval_of_another_tenant_is_not_found(store: Store) -> None:
    approval_id = pending(store)

    with pytest.raises(NotFound):
        store.decide_approval(
            DecideApproval(approval_id, approve=True, decided_by="bob", now=SOON, tenant="globex")
        )


def test_an_approval_past_its_expiry_cannot_be_granted_and_expires(store: Store) -> None:
    approval_id = pending(store)
    late = NOW + timedelta(hours=1)

    with pytest.raises(StaleLease, match="expired"):
        store.decide_approval(DecideApproval(approval_id, approve=True, decided_by="bob", now=late))
    with pytest.raises(StaleLease, match="does not expire until"):
        store.expire_approval(ExpireApproval(approval_id, now=SOON))
    expired = store.expire_approval(ExpireApproval(approval_id, now=late))

    assert expired.status == "expired"
    call = store.get_call("tc-1")
    assert call is not None and call.status == "expired"


def test_an_approved_call_that_fails_reauthorization_is_denied_under_the_policy_then_in_force(
    store: Store,
) -> None:
    approval_id = pending(store)  # requested under policy 7
    store.decide_approval(DecideApproval(approval_id, approve=True, decided_by="bob", now=SOON))

    call = store.deny_approved(
        ApprovedDenial("tc-1", reason="policy_changed", detail="now over limit", now=SOON, policy_version="9")
    )

    assert (call.status, call.reason, call.policy_version) == ("denied", "policy_changed", "9")
    assert store.events(tool_call_id="tc-1")[-1].policy_version == "9"
    store.rebuild()
    assert store.get_call("tc-1") == call
    assert store.verify().ok


def test_the_migration_gives_a_call_denied_at_execution_the_version_of_its_denial(own_store: Store) -> None:
    store = own_store  # the downgrade changes the projection: never the suite's shared one
    approval_id = pending(store)
    store.decide_approval(DecideApproval(approval_id, approve=True, decided_by="bob", now=SOON))
    store.deny_approved(ApprovedDenial("tc-1", reason="policy_changed", now=SOON, policy_version="9"))
    store.admit(call_request(tool_call_id="tc-refused", idempotency_key="k-2", decision=DENY))
    config = store._alembic_config()

    with store.engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0025_scoped_keys")
    # The row as the projection before this revision left it: the request's version.
    assert [store.get_call(c).policy_version for c in ("tc-1", "tc-refused")] == ["7", "7"]  # type: ignore[union-attr]
    with store.engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "head")

    assert [store.get_call(c).policy_version for c in ("tc-1", "tc-refused")] == ["9", "7"]  # type: ignore[union-attr]
    assert store.verify().ok


def test_rebuild_reproduces_the_approval_leg(store: Store) -> None:
    approval_id = pending(store)
    store.decide_approval(DecideApproval(approval_id, approve=True, decided_by="bob", now=SOON))
    store.dispatch_approved(ApprovedDispatch("tc-1", now=SOON))
    before = (store.get_call("tc-1"), store.get_approval(approval_id))

    store.rebuild()

    assert (store.get_call("tc-1"), store.get_approval(approval_id)) == before
    assert store.verify().ok
