"""Code run in other processes by the approval concurrency test (importable, so the forkserver finds it)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import anyio

from capabilities.fake import FakeExecutor, completed, fake_capability
from capabilities.registry import Registry
from gateway.calls.actions import Redactor
from gateway.calls.approvals import DecisionInput, Decisions
from gateway.calls.dispatch import Dispatcher
from gateway.calls.pipeline import CallPipeline
from gateway.calls.resume import Resumer
from gateway.errors import Refused
from policy.engine import Policy
from store.store import Store

SCHEMA = {"type": "object", "properties": {"order_id": {"type": "string"}, "amount": {"type": "number"}}}
REFUND = fake_capability("refund_order", input_schema=SCHEMA, timeout_s=5)
POLICY = {
    "rules": [
        {"id": "agents", "tools": ["*"], "roles": ["agent"], "decision": "allow"},
        {
            "id": "big",
            "tools": ["refund_order"],
            "when": "double(args.amount) > 100.0",
            "decision": "require_approval",
            "reason": "amount_over_approval_threshold",
            "approval": {"approver_role": "approver", "expires_in": "1h"},
        },
    ]
}


def parts(url: str, owner: str) -> tuple[Store, FakeExecutor, CallPipeline, Resumer, Decisions]:
    """A gateway's approval machinery over the store at `url`, with a counting fake executor."""
    store = Store.open(url)
    executor = FakeExecutor(default=completed({"refund_id": "r1"}))
    policy = Policy.from_mapping(POLICY)
    registry = Registry({"fake": executor}, [REFUND])
    pipeline = CallPipeline(
        store=store,
        registry=registry,
        policy=lambda: policy,
        redactor=Redactor(b"salt"),
        owner=owner,
    )
    pipeline.prepare()

    def clock() -> datetime:
        return datetime.now(UTC)

    resumer = Resumer(
        store=store.with_producer(owner),
        agenda=store,
        dispatcher=Dispatcher(store=store, registry=registry, redactor=Redactor(b"salt"), clock=clock),
        registry=registry,
        policy=lambda: policy,
        clock=clock,
        owner=owner,
    )
    return store, executor, pipeline, resumer, Decisions(store, clock)


def decide_and_resume(url: str, approval_id: str, barrier: Any, results: Any, worker: int) -> None:
    """Race the other processes to approve, then run resume passes; report what this process did."""
    store, executor, _pipeline, resumer, decisions = parts(url, f"worker-{worker}")
    try:
        barrier.wait(timeout=60)
        try:
            decisions.decide_now(
                DecisionInput(approval_id, True, f"approver-{worker}", roles=frozenset({"approver"}))
            )
            decided = "approved"
        except Refused as exc:
            decided = exc.code
        barrier.wait(timeout=60)  # everyone decided; now everyone races to run it

        async def passes() -> None:
            for _ in range(3):
                await resumer.tick()

        anyio.run(passes)
        results.put((decided, len(executor.invocations)))
    except BaseException as error:  # the parent must hear of a failure instead of waiting for it
        results.put(("error", repr(error)))
    finally:
        store.close()
