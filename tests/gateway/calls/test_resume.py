"""Approvals end to end in one process: decisions only record, the worker re-authorizes and runs once."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest
import sqlalchemy as sa

from capabilities.fake import FakeExecutor, completed, failed, fake_capability
from capabilities.registry import Registry
from gateway.calls.actions import Redactor, action_hash, contract_hash
from gateway.calls.approvals import DecisionInput, Decisions
from gateway.calls.dispatch import Dispatcher
from gateway.calls.periodic import Wake, run_periodically
from gateway.calls.pipeline import CallInput, CallPipeline
from gateway.calls.resume import Resumer
from gateway.calls.retries import RetryRequest, retry_call
from gateway.errors import Refused
from gateway.mcp.results import status_document
from policy.engine import Policy
from policy.model import Principal
from store.canonical import legacy_json
from store.commands import RevokePrincipal
from store.schema import approvals, effect_ledger, held_arguments, tool_calls
from store.store import Store
from tests.eventually import eventually
from tests.handoffs import hand_offs
from tests.store.builders import call_request

pytestmark = pytest.mark.anyio

SCHEMA = {
    "type": "object",
    "properties": {"order_id": {"type": "string"}, "amount": {"type": "number"}, "iban": {"type": "string"}},
    "required": ["order_id", "amount"],
}
REFUND = fake_capability("refund_order", input_schema=SCHEMA, timeout_s=1, redact=("iban",))
ALICE = Principal("alice", tenant="acme", roles=frozenset({"agent", "approver"}))
BOB = frozenset({"approver"})
T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def rules(
    approver_role: str = "approver", limit: float = 10000, *, requester_may_approve: bool = False
) -> Policy:
    return Policy.from_mapping(
        {
            "rules": [
                {"id": "agents", "tools": ["*"], "roles": ["agent"], "decision": "allow"},
                {
                    "id": "big",
                    "tools": ["refund_order"],
                    "when": "double(args.amount) > 100.0",
                    "decision": "require_approval",
                    "reason": "amount_over_approval_threshold",
                    "approval": {
                        "approver_role": approver_role,
                        "expires_in": "1h",
                        "requester_may_approve": requester_may_approve,
                    },
                },
                {
                    "id": "huge",
                    "tools": ["refund_order"],
                    "when": f"double(args.amount) > {limit}",
                    "decision": "deny",
                    "reason": "amount_over_limit",
                },
            ]
        }
    )


@dataclass
class World:
    store: Store
    executor: FakeExecutor
    pipeline: CallPipeline
    decisions: Decisions
    resumer: Resumer
    registry: Registry
    policy: list[Policy] = field(default_factory=lambda: [rules()])
    now: list[datetime] = field(default_factory=lambda: [T0])

    async def request(self, amount: float = 250, key: str = "k1", *, iban: bool = True) -> Any:
        arguments: dict[str, Any] = {"order_id": "1001", "amount": amount}
        if iban:
            arguments["iban"] = "DE89370400440532013000"
        report = await self.pipeline.call(
            CallInput(
                principal=ALICE,
                tool_name="refund_order",
                arguments=arguments,
                idempotency_key=key,
            )
        )
        assert report.call.status == "approval_pending"
        return report.call

    async def decide(self, approval_id: str, approve: bool = True, who: str = "bob", **kw: Any) -> Any:
        return await self.decisions.decide(
            DecisionInput(approval_id, approve, who, roles=kw.pop("roles", BOB), tenant="acme", **kw)
        )


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    store = Store.open(f"sqlite:///{tmp_path / 'writ.db'}")
    store.migrate()
    executor = FakeExecutor(default=completed({"refund_id": "r1"}))
    holder: list[Policy] = [rules()]
    now: list[datetime] = [T0]
    registry = Registry({"fake": executor}, [REFUND])
    pipeline = CallPipeline(
        store=store,
        registry=registry,
        policy=lambda: holder[0],
        redactor=Redactor(b"salt"),
        clock=lambda: now[0],
        owner="test-worker",
    )
    pipeline.prepare()
    resumer = Resumer(
        store=store,
        agenda=store,
        dispatcher=Dispatcher(
            store=store, registry=registry, redactor=Redactor(b"salt"), clock=lambda: now[0]
        ),
        registry=registry,
        policy=lambda: holder[0],
        clock=lambda: now[0],
        owner="test-worker",
    )
    decisions = Decisions(store, lambda: now[0])
    yield World(store, executor, pipeline, decisions, resumer, registry, holder, now)
    store.close()


async def test_deciding_records_the_decision_and_the_worker_runs_the_call_exactly_once(world: World) -> None:
    call = await world.request()
    await world.decide(call.approval_id, reason="customer is right")
    assert world.executor.invocations == []  # the decision itself executes nothing

    assert await world.resumer.tick() == (0, 1)
    assert await world.resumer.tick() == (0, 0)

    done = world.store.get_call(call.tool_call_id)
    assert done is not None and done.status == "completed" and done.result is not None
    assert len(world.executor.invocations) == 1
    types = [e.type for e in world.store.events(tool_call_id=call.tool_call_id)]
    assert types == [
        "tool_call.requested",
        "approval.required",
        "approval.granted",
        "tool_call.dispatching",
        "tool_call.completed",
    ]


async def test_the_approved_call_is_dispatched_with_the_full_arguments_while_the_log_keeps_redactions(
    world: World,
) -> None:
    call = await world.request()
    assert str(call.arguments["iban"]).startswith("redacted:")
    await world.decide(call.approval_id)
    await world.resumer.tick()

    [sent] = world.executor.invocations
    assert sent.arguments["iban"] == "DE89370400440532013000"
    assert world.store.held_arguments(call.approval_id) is None  # released once settled


async def test_a_used_approval_replayed_executes_nothing(world: World) -> None:
    call = await world.request()
    await world.decide(call.approval_id)
    await world.resumer.tick()

    with pytest.raises(Refused) as refused:
        await world.decide(call.approval_id)
    assert refused.value.code == "already_decided" and refused.value.http_status == 409
    done = world.store.get_call(call.tool_call_id)
    assert done is not None
    assert await world.resumer.resume(done) is None
    assert len(world.executor.invocations) == 1


async def test_a_rejected_call_is_never_dispatched(world: World) -> None:
    call = await world.request()
    await world.decide(call.approval_id, approve=False, reason="not our order")
    await world.resumer.tick()

    rejected = world.store.get_call(call.tool_call_id)
    assert rejected is not None and rejected.status == "rejected"
    assert world.executor.invocations == []


async def test_a_decision_after_expiry_is_refused_and_records_the_expiry(world: World) -> None:
    call = await world.request()
    world.now[0] = T0 + timedelta(hours=1)  # exactly at expiry: too late

    with pytest.raises(Refused) as refused:
        await world.decide(call.approval_id)

    assert refused.value.code == "expired"
    approval = world.store.get_approval(call.approval_id)
    assert approval is not None and approval.status == "expired"
    await world.resumer.tick()
    assert world.executor.invocations == []


async def test_the_worker_expires_overdue_approvals(world: World) -> None:
    call = await world.request()
    assert await world.resumer.tick() == (0, 0)
    world.now[0] = T0 + timedelta(hours=2)

    assert await world.resumer.tick() == (1, 0)
    expired = world.store.get_call(call.tool_call_id)
    assert expired is not None and expired.status == "expired"


async def test_the_worker_expires_calls_whose_confirmation_was_never_answered(world: World) -> None:
    world.store.admit(
        call_request(
            tool_call_id="tc-confirm",
            confirmation_id="cf-1",
            confirmation_expires_at=T0 + timedelta(minutes=10),
        )
    )
    assert await world.resumer.tick() == (0, 0)
    world.now[0] = T0 + timedelta(minutes=10)

    assert await world.resumer.tick() == (1, 0)
    expired = world.store.get_call("tc-confirm")
    assert expired is not None and (expired.status, expired.reason) == ("expired", "confirmation_expired")


async def test_a_pass_with_nothing_due_only_looks_and_hands_nothing_to_a_thread(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    await world.request()  # awaiting its approver, not yet expired: nothing for the worker to do
    handed = hand_offs(monkeypatch)

    assert await world.resumer.tick() == (0, 0)
    assert handed == []


async def test_a_local_grant_wakes_the_worker_and_its_next_pass_runs_the_call(world: World) -> None:
    call = await world.request()
    wake = Wake()
    decisions = Decisions(world.store, lambda: world.now[0], on_granted=wake)
    passes: list[tuple[int, int]] = []

    async def tick() -> None:
        passes.append(await world.resumer.tick())

    async with anyio.create_task_group() as workers:
        # An hour between passes: only the wake can bring the next one within the test's wait.
        workers.start_soon(lambda: run_periodically(tick, interval_s=3600, failure="x", wake=wake))
        await eventually(lambda: passes)  # the first pass is over, and found nothing to run
        await decisions.decide(DecisionInput(call.approval_id, True, "bob", roles=BOB, tenant="acme"))

        done = await eventually(
            lambda: world.store.get_call(call.tool_call_id), lambda c: c.status == "completed"
        )
        workers.cancel_scope.cancel()
    assert done is not None and len(world.executor.invocations) == 1


async def test_an_approved_call_the_current_policy_denies_is_refused_with_the_reason(world: World) -> None:
    call = await world.request(amount=250)
    await world.decide(call.approval_id)
    world.policy[0] = rules(limit=200)  # policy tightened after the approval

    await world.resumer.tick()

    refused = world.store.get_call(call.tool_call_id)
    assert refused is not None and (refused.status, refused.reason) == ("denied", "amount_over_limit")
    assert world.executor.invocations == []
    # Told as denied under the policy that denied it, not the one it was requested under.
    assert call.policy_version != world.policy[0].version
    assert status_document(refused)["policyVersion"] == world.policy[0].version


async def test_an_approval_by_a_role_the_policy_no_longer_accepts_is_refused(world: World) -> None:
    call = await world.request()
    await world.decide(call.approval_id)
    world.policy[0] = rules(approver_role="finance")

    await world.resumer.tick()

    refused = world.store.get_call(call.tool_call_id)
    assert refused is not None and (refused.status, refused.reason) == ("denied", "approval_insufficient")
    assert world.executor.invocations == []


async def test_a_retry_approved_by_its_asker_is_refused_once_requesters_may_no_longer_approve(
    world: World,
) -> None:
    world.executor.then(failed())
    first = await world.request(iban=False)  # a call with redacted fields is not retried
    await world.decide(first.approval_id, who="carol")
    await world.resumer.tick()
    assert (original := world.store.get_call(first.tool_call_id)) is not None and original.status == "failed"
    world.policy[0] = rules(requester_may_approve=True)
    retry = await retry_call(
        RetryRequest(first.tool_call_id, "bob", "order fixed", BOB, "acme"),
        store=world.store,
        registry=world.registry,
        pipeline=world.pipeline,
    )
    await world.decide(retry.call.approval_id, who="bob")  # allowed: requesters may approve, for now
    world.policy[0] = rules()  # tightened before the approved retry ran

    await world.resumer.tick()

    refused = world.store.get_call(retry.call.tool_call_id)
    assert refused is not None and (refused.status, refused.reason) == ("denied", "self_approval_forbidden")
    assert len(world.executor.invocations) == 1  # the original's one dispatch, nothing since


async def test_an_approval_used_for_a_changed_action_is_refused(world: World) -> None:
    call = await world.request()
    await world.decide(call.approval_id)
    with world.store.engine.begin() as conn:  # someone swaps the held arguments under the approval
        conn.execute(
            sa.update(held_arguments).values(arguments='{"amount":9000,"iban":"GB00XXXX","order_id":"1001"}')
        )

    await world.resumer.tick()

    refused = world.store.get_call(call.tool_call_id)
    assert refused is not None and refused.reason == "approval_binding_mismatch"
    assert world.executor.invocations == []


async def test_an_approval_whose_hashes_were_taken_before_rfc8785_still_runs_its_call(world: World) -> None:
    # A call that waited for approval across the upgrade: its action and contract hashes were taken
    # in the earlier JSON spelling (1e-05 there, 0.00001 now) and are checked in that spelling.
    arguments = {"order_id": "1001", "amount": 250, "fee": 1e-05, "iban": "DE89370400440532013000"}
    report = await world.pipeline.call(
        CallInput(principal=ALICE, tool_name="refund_order", arguments=arguments, idempotency_key="k1")
    )
    call = report.call
    assert call.status == "approval_pending" and call.approval_id is not None
    earlier = action_hash(REFUND, arguments, ALICE, spelling=legacy_json)
    assert earlier != call.action_hash
    with world.store.engine.begin() as conn:
        for table in (tool_calls, approvals, effect_ledger):
            conn.execute(sa.update(table).values(action_hash=earlier))
        conn.execute(sa.update(tool_calls).values(contract_hash=contract_hash(REFUND, spelling=legacy_json)))
    await world.decide(call.approval_id)

    assert await world.resumer.tick() == (0, 1)

    done = world.store.get_call(call.tool_call_id)
    assert done is not None and done.status == "completed"
    assert len(world.executor.invocations) == 1


async def test_a_principal_revoked_after_requesting_is_refused(world: World) -> None:
    call = await world.request()
    await world.decide(call.approval_id)
    world.store.revoke_principal(RevokePrincipal("acme", "alice", revoked_by="root", now=world.now[0]))

    await world.resumer.tick()

    refused = world.store.get_call(call.tool_call_id)
    assert refused is not None and refused.reason == "principal_revoked"
    assert world.executor.invocations == []
