"""Deciding approvals: who may decide, the stable refusal codes, and what a decision records.

The store is a fake (tests/fakes.py): these rules are the gateway's; the store suite holds the
database's side of them.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gateway.calls.approvals import DecisionInput, Decisions
from gateway.errors import Refused
from store.model import ApprovalView
from tests.fakes import FakeApprovals

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
BOB = frozenset({"approver"})


def awaiting(requester_may_approve: bool = False) -> ApprovalView:
    return ApprovalView(
        approval_id="ap-1",
        tool_call_id="tc-1",
        tenant="acme",
        status="awaiting_approval",
        requester="alice",
        approver_role="approver",
        requester_may_approve=requester_may_approve,
        action_hash="h",
        expires_at=T0 + timedelta(hours=1),
        created_at=T0,
    )


def decisions(store: FakeApprovals, now: datetime = T0, woken: list[str] | None = None) -> Decisions:
    wakes = woken if woken is not None else []
    return Decisions(store, lambda: now, on_granted=lambda: wakes.append("woken"))


def refusal(store: FakeApprovals, inp: DecisionInput, now: datetime = T0) -> tuple[str, int]:
    with pytest.raises(Refused) as refused:
        decisions(store, now).decide_now(inp)
    return refused.value.code, refused.value.http_status


@pytest.mark.anyio
async def test_a_grant_records_the_decider_their_roles_and_wakes_the_worker() -> None:
    store, woken = FakeApprovals([awaiting()]), list[str]()

    approval = await decisions(store, woken=woken).decide(
        DecisionInput("ap-1", True, "bob", reason="ok", roles=BOB, tenant="acme")
    )

    assert (approval.status, approval.decided_by, approval.decided_at) == ("approved", "bob", T0)
    [cmd] = store.decided
    assert (cmd.reason, cmd.tenant, cmd.decided_by_roles, cmd.break_glass) == ("ok", "acme", BOB, False)
    assert woken == ["woken"]


@pytest.mark.anyio
async def test_a_rejection_does_not_wake_the_worker() -> None:
    store, woken = FakeApprovals([awaiting()]), list[str]()

    approval = await decisions(store, woken=woken).decide(DecisionInput("ap-1", False, "bob", roles=BOB))

    assert approval.status == "rejected" and woken == []


def test_the_requester_may_not_approve_their_own_call() -> None:
    store = FakeApprovals([awaiting()])

    assert refusal(store, DecisionInput("ap-1", True, "alice", roles=BOB)) == ("self_approval_forbidden", 403)
    assert store.decided == []


def test_the_requester_may_approve_where_the_policy_says_so() -> None:
    store = FakeApprovals([awaiting(requester_may_approve=True)])

    assert decisions(store).decide_now(DecisionInput("ap-1", True, "alice", roles=BOB)).status == "approved"


def test_whoever_asked_for_a_retry_may_not_approve_it_but_may_reject_it() -> None:
    # tc-1 is bob's retry of alice's failed call: bob stands to it as a requester does.
    store = FakeApprovals([awaiting()], retried_by={"tc-1": "bob"})

    with pytest.raises(Refused, match="bob asked for this retry") as refused:
        decisions(store).decide_now(DecisionInput("ap-1", True, "bob", roles=BOB))
    assert (refused.value.code, refused.value.http_status) == ("self_approval_forbidden", 403)
    assert store.decided == []
    assert decisions(store).decide_now(DecisionInput("ap-1", False, "bob", roles=BOB)).status == "rejected"


def test_someone_other_than_the_requester_and_the_retrys_asker_approves_a_retry() -> None:
    store = FakeApprovals([awaiting()], retried_by={"tc-1": "bob"})

    assert refusal(store, DecisionInput("ap-1", True, "alice", roles=BOB)) == ("self_approval_forbidden", 403)
    assert decisions(store).decide_now(DecisionInput("ap-1", True, "carol", roles=BOB)).status == "approved"


def test_the_retrys_asker_approves_it_where_the_policy_lets_a_requester_approve() -> None:
    store = FakeApprovals([awaiting(requester_may_approve=True)], retried_by={"tc-1": "bob"})

    assert decisions(store).decide_now(DecisionInput("ap-1", True, "bob", roles=BOB)).status == "approved"


def test_a_decider_without_the_approver_role_is_refused() -> None:
    store = FakeApprovals([awaiting()])

    assert refusal(store, DecisionInput("ap-1", True, "bob", roles=frozenset({"auditor"}))) == (
        "not_approver",
        403,
    )


def test_another_tenants_approval_is_not_found() -> None:
    store = FakeApprovals([awaiting()])

    assert refusal(store, DecisionInput("ap-1", True, "eve", roles=BOB, tenant="other")) == ("not_found", 404)


def test_a_decision_after_expiry_is_refused_and_records_the_expiry() -> None:
    store = FakeApprovals([awaiting()])
    at_expiry = T0 + timedelta(hours=1)  # exactly at expiry: too late

    assert refusal(store, DecisionInput("ap-1", True, "bob", roles=BOB), now=at_expiry) == ("expired", 409)

    assert [(e.approval_id, e.now) for e in store.expired] == [("ap-1", at_expiry)]
    assert store.approvals["ap-1"].status == "expired" and store.decided == []


def test_a_second_decision_is_refused_with_who_decided_first() -> None:
    store = FakeApprovals([awaiting()])
    decisions(store).decide_now(DecisionInput("ap-1", False, "carol", roles=BOB))

    with pytest.raises(Refused) as refused:
        decisions(store).decide_now(DecisionInput("ap-1", True, "bob", roles=BOB))

    assert (refused.value.code, refused.value.http_status) == ("already_decided", 409)
    assert "rejected by carol" in str(refused.value)


def test_a_break_glass_operator_decides_without_roles_and_is_marked() -> None:
    store = FakeApprovals([awaiting()])

    decisions(store).decide_now(DecisionInput("ap-1", True, "operator:root", break_glass=True))

    [cmd] = store.decided
    assert (cmd.break_glass, cmd.decided_by_roles) == (True, None)


def test_a_decider_name_or_reason_the_record_cannot_hold_is_refused_before_the_store() -> None:
    store = FakeApprovals([awaiting()])

    assert refusal(store, DecisionInput("ap-1", True, "b" * 10_000, roles=BOB))[0] == "invalid_request"
    assert (
        refusal(store, DecisionInput("ap-1", True, "bob", reason="\x00", roles=BOB))[0] == "invalid_request"
    )
    assert store.decided == []
