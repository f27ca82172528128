"""Reads allowed outright: run first, then recorded whole in one commit; joined in memory while in flight.

The real pipeline, dispatcher and SQLite store, with a scripted executor (`FakeExecutor`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest

from capabilities.contract import Capability
from capabilities.fake import FakeExecutor, completed, fake_capability
from capabilities.registry import Registry
from gateway.calls.actions import Redactor
from gateway.calls.dispatch import Dispatcher
from gateway.calls.pipeline import CallInput, CallPipeline, CallReport
from policy.engine import Policy
from policy.model import Principal
from store.commands import RevokePrincipal
from store.keys import scoped_key
from store.store import Store
from tests.commits import write_commits
from tests.eventually import eventually

pytestmark = pytest.mark.anyio

SCHEMA = {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}
LOOKUP = fake_capability("lookup_order", effect="read", input_schema=SCHEMA, timeout_s=0.5)
REFUND = fake_capability("refund_order", effect="write", input_schema=SCHEMA, timeout_s=0.5)
ALICE = Principal("alice", tenant="acme", roles=frozenset({"agent"}))
ALLOW = {"id": "agents", "tools": ["*"], "roles": ["agent"], "decision": "allow"}
ANSWER = {"order_id": "1001", "amount": "250.00"}


def _pipeline(
    store: Store, executor: FakeExecutor, lookup: Capability = LOOKUP, **policy: Any
) -> CallPipeline:
    registry = Registry({"fake": executor}, [lookup, REFUND])
    redactor = Redactor(b"salt")
    rules = Policy.from_mapping({"rules": [ALLOW], **policy})
    clock = lambda: datetime.now(UTC)  # noqa: E731
    dispatcher = Dispatcher(
        store=store, registry=registry, redactor=redactor, clock=clock, executor_grace_s=0.3
    )
    p = CallPipeline(
        store=store, registry=registry, policy=lambda: rules, redactor=redactor, dispatcher=dispatcher
    )
    p.prepare()
    return p


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store.open(f"sqlite:///{tmp_path / 'writ.db'}")
    s.migrate()
    yield s
    s.close()


@pytest.fixture
def executor() -> FakeExecutor:
    return FakeExecutor(default=completed(ANSWER))


@pytest.fixture
def pipeline(store: Store, executor: FakeExecutor) -> CallPipeline:
    return _pipeline(store, executor)


def call(tool: str = "lookup_order", key: str | None = None, order: str = "1001") -> CallInput:
    return CallInput(principal=ALICE, tool_name=tool, arguments={"order_id": order}, idempotency_key=key)


def types(store: Store, tool_call_id: str | None = None) -> list[str]:
    return [e.type for e in store.events(tool_call_id=tool_call_id)]


async def _while_running(
    pipeline: CallPipeline, store: Store, executor: FakeExecutor, inp: CallInput
) -> tuple[list[str], CallReport]:
    """The events recorded while the executor holds `inp`, and the call's report once it answers."""
    executor.gate = anyio.Event()
    reports: list[CallReport] = []
    before = len(executor.invocations)

    async def one() -> None:
        reports.append(await pipeline.call(inp))

    async with anyio.create_task_group() as tg:
        tg.start_soon(one)
        await eventually(lambda: len(executor.invocations) > before, within_s=5)
        during = types(store)
        executor.gate.set()
    return during, reports[0]


async def test_an_allowed_read_runs_before_anything_is_recorded_then_is_recorded_in_one_commit(
    pipeline: CallPipeline, store: Store, executor: FakeExecutor
) -> None:
    with write_commits(store) as seen:
        during, report = await _while_running(pipeline, store, executor, call())

    assert during == []
    assert len(seen) == 1
    assert (report.kind, report.call.status) == ("new", "completed")
    assert report.call.result is not None and report.call.result["structuredContent"] == ANSWER
    # A call that names no run and has no session is in none: no run.started (issue 16).
    assert types(store) == [
        "tool_call.requested",
        "tool_call.dispatching",
        "tool_call.completed",
    ]
    # Sent before anything was recorded, under the key its record then says it was sent under.
    dispatched = store.events()[1].payload["idempotency_key"]
    assert executor.invocations[0].idempotency_key == dispatched == report.call.sent_key
    assert dispatched == scoped_key(ALICE.tenant, ALICE.subject, report.call.idempotency_key)
    assert store.verify().ok


async def test_a_write_and_a_read_under_the_clients_key_are_recorded_before_they_run(
    pipeline: CallPipeline, store: Store, executor: FakeExecutor
) -> None:
    for inp in (call(tool="refund_order", key="w-1"), call(key="r-1")):
        with write_commits(store) as seen:
            during, report = await _while_running(pipeline, store, executor, inp)
        assert during[-2:] == ["tool_call.requested", "tool_call.dispatching"]
        assert len(seen) == 2
        assert report.call.status == "completed"


async def test_identical_reads_in_flight_share_one_backend_call_and_one_record(
    pipeline: CallPipeline, store: Store, executor: FakeExecutor
) -> None:
    executor.gate = anyio.Event()
    reports: list[CallReport] = []

    async def one() -> None:
        reports.append(await pipeline.call(call()))

    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(one)
        await eventually(lambda: executor.invocations, within_s=5)
        await anyio.sleep(0.05)  # the others arrive while the first is still at the backend
        executor.gate.set()

    assert len(executor.invocations) == 1
    assert sorted(r.kind for r in reports) == ["joined", "joined", "new"]
    assert {r.call.tool_call_id for r in reports} == {reports[0].call.tool_call_id}
    assert {r.call.status for r in reports} == {"completed"}
    assert types(store).count("tool_call.requested") == 1


async def test_different_reads_in_flight_are_not_joined(
    pipeline: CallPipeline, store: Store, executor: FakeExecutor
) -> None:
    async with anyio.create_task_group() as tg:
        tg.start_soon(pipeline.call, call(order="1001"))
        tg.start_soon(pipeline.call, call(order="1002"))

    assert sorted(i.arguments["order_id"] for i in executor.invocations) == ["1001", "1002"]
    assert types(store).count("tool_call.completed") == 2


async def test_a_read_whose_client_goes_away_is_still_recorded_for_those_joined_to_it(
    pipeline: CallPipeline, store: Store, executor: FakeExecutor
) -> None:
    executor.gate = anyio.Event()
    joined: list[CallReport] = []

    async def second() -> None:
        joined.append(await pipeline.call(call()))

    async with anyio.create_task_group() as outer, anyio.create_task_group() as first:
        first.start_soon(pipeline.call, call())
        await eventually(lambda: executor.invocations, within_s=5)
        outer.start_soon(second)
        await anyio.sleep(0.05)
        first.cancel_scope.cancel()  # the first client disconnects while the backend works
        executor.gate.set()

    assert [r.call.status for r in joined] == ["completed"]
    assert len(executor.invocations) == 1
    assert types(store).count("tool_call.completed") == 1


async def test_a_revoked_principals_read_never_reaches_the_backend_and_is_recorded_refused(
    pipeline: CallPipeline, store: Store, executor: FakeExecutor
) -> None:
    store.revoke_principal(RevokePrincipal("acme", "alice", revoked_by="root", now=datetime.now(UTC)))

    report = await pipeline.call(call())

    assert executor.invocations == []
    assert (report.call.status, report.call.reason) == ("denied", "principal_revoked")


async def test_a_read_over_its_calls_budget_never_reaches_the_backend_and_is_recorded_refused(
    store: Store, executor: FakeExecutor
) -> None:
    pipeline = _pipeline(store, executor, budgets=[{"id": "lookups", "tools": ["lookup_order"], "limit": 2}])

    reports = [await pipeline.call(call(order=str(n))) for n in range(3)]

    assert [r.call.status for r in reports] == ["completed", "completed", "denied"]
    assert reports[2].call.reason == "budget_exceeded" and reports[2].breach is not None
    assert len(executor.invocations) == 2
    assert types(store).count("budget.exceeded") == 1


async def test_a_read_a_budget_and_a_loop_rule_count_is_still_recorded_in_one_commit(
    store: Store, executor: FakeExecutor
) -> None:
    counted = {
        "budgets": [{"id": "calls", "tools": ["*"], "window": "1h", "limit": 100}],
        "loops": [{"id": "same", "tools": ["*"], "threshold": 50, "window": "1m"}],
    }
    pipeline = _pipeline(store, executor, **counted)

    with write_commits(store) as read_commits:
        during, read = await _while_running(pipeline, store, executor, call())
    with write_commits(store) as write_commits_seen:
        await pipeline.call(call(tool="refund_order"))

    assert during == [] and read.call.status == "completed"
    assert len(read_commits) == 1
    assert len(write_commits_seen) == 2  # a write is admitted, charged, before it runs
    requested = store.events(tool_call_id=read.call.tool_call_id)[0].payload
    assert requested["charges"] and requested["loops"]


async def test_twenty_concurrent_counted_reads_against_a_limit_of_ten_answer_exactly_ten(
    store: Store, executor: FakeExecutor
) -> None:
    # The backend holds every read until all 20 reached it: a timeout long enough for a loaded machine
    # to bring the last one there (0.5 s was not always).
    patient = replace(LOOKUP, timeout_s=30.0)
    budgets = [{"id": "lookups", "tools": ["lookup_order"], "limit": 10}]
    pipeline = _pipeline(store, executor, patient, budgets=budgets)
    executor.gate = anyio.Event()
    reports: list[CallReport] = []

    async def one(n: int) -> None:
        reports.append(await pipeline.call(call(order=str(n))))

    async with anyio.create_task_group() as tg:
        for n in range(20):
            tg.start_soon(one, n)
        # Every read looked at the counter before any was recorded: all were sent to the backend.
        await eventually(lambda: len(executor.invocations) == 20, within_s=10)
        executor.gate.set()

    answered = [r for r in reports if r.call.status == "completed"]
    refused = [r for r in reports if r.call.status == "denied"]
    assert (len(answered), len(refused)) == (10, 10)
    assert all(r.call.result is not None for r in answered)
    assert all(r.call.reason == "budget_exceeded" and r.breach and r.call.result is None for r in refused)
    assert types(store).count("budget.exceeded") == 10
    assert store.verify().ok


async def test_sequential_calls_through_the_pipeline_never_hold_a_commit_back(
    pipeline: CallPipeline, store: Store
) -> None:
    for i in range(3):
        await pipeline.call(call(order=f"{i}"))
        await pipeline.call(call(tool="refund_order", key=f"w-{i}", order=f"{i}"))

    assert store.writer.arrivals.announced
    assert store.writer.waits == 0
    assert len(store.writer.arrivals.coming) == 0  # every call counted itself out as it ended
    assert not store.writer.arrivals.away  # and came back from its backend, whose time was learnt
    assert store.writer.arrivals.times.due(LOOKUP.ref, 0.0) is not None


async def test_a_call_waiting_at_its_backend_does_not_hold_back_another_calls_commit(
    pipeline: CallPipeline, store: Store, executor: FakeExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    from store import batching

    # A wait for a call at its backend would last this bound and fail the test's own bound. (The
    # backend's answer time is not known yet, so the read is not due back: store.coming.AwayTimes.)
    monkeypatch.setattr(batching, "COMING_S", 30.0)
    executor.gate = anyio.Event()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(pipeline.call, call(order="1001"))
            await eventually(lambda: executor.invocations, within_s=5)
            tg.start_soon(pipeline.call, call(tool="refund_order", key="w-1", order="1002"))
            # The write's admission commits while the read waits at the backend.
            await eventually(lambda: len(executor.invocations) == 2, within_s=5)
            executor.gate.set()

    assert store.writer.waits == 0
    assert types(store).count("tool_call.completed") == 2
