"""The call pipeline with a scripted executor and a real SQLite store: the resume contract, unit-sized."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import anyio
import pytest

from capabilities.fake import FakeExecutor, completed, fake_capability
from capabilities.registry import Registry
from gateway.calls.actions import Redactor
from gateway.calls.dispatch import Dispatcher
from gateway.calls.pipeline import CallInput, CallPipeline
from gateway.errors import UnknownTool
from policy.engine import Policy
from policy.model import Principal
from store.keys import scoped_key
from store.store import Store
from tests.eventually import eventually

pytestmark = pytest.mark.anyio

SCHEMA = {
    "type": "object",
    "properties": {"order_id": {"type": "string"}, "amount": {"type": "number"}},
    "required": ["order_id", "amount"],
}
REFUND = fake_capability("refund_order", effect="write", input_schema=SCHEMA, timeout_s=0.2)
LOOKUP = fake_capability("lookup_order", effect="read", input_schema=SCHEMA, timeout_s=0.2)
POLICY = Policy.from_mapping(
    {
        "rules": [
            {"id": "agents", "tools": ["*"], "roles": ["agent"], "decision": "allow"},
            {
                "id": "big",
                "tools": ["refund_order"],
                "when": "double(args.amount) > 1000.0",
                "decision": "deny",
                "reason": "amount_over_limit",
            },
        ]
    }
)
ALICE = Principal("alice", tenant="acme", roles=frozenset({"agent"}))


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store.open(f"sqlite:///{tmp_path / 'writ.db'}")
    s.migrate()
    yield s
    s.close()


@pytest.fixture
def executor() -> FakeExecutor:
    return FakeExecutor(default=completed({"refund_id": "r1"}))


@pytest.fixture
def pipeline(store: Store, executor: FakeExecutor, tmp_path: Path) -> CallPipeline:
    registry = Registry({"fake": executor}, [REFUND, LOOKUP])
    redactor = Redactor(b"salt")
    dispatcher = Dispatcher(
        store=store,
        registry=registry,
        redactor=redactor,
        clock=lambda: datetime.now(UTC),
        executor_grace_s=0.3,
    )
    p = CallPipeline(
        store=store,
        registry=registry,
        policy=lambda: POLICY,
        redactor=redactor,
        dispatcher=dispatcher,
        join_wait_s=5.0,
    )
    p.prepare()
    return p


def test_a_tool_name_mcp_clients_may_refuse_is_warned_about_at_start(
    store: Store, executor: FakeExecutor, caplog: pytest.LogCaptureFixture
) -> None:
    # An upstream's "write file/ü" was exposed as it was, without a word.
    odd = fake_capability("write file/ü", id="files.write")
    registry = Registry({"fake": executor}, [REFUND, odd])
    p = CallPipeline(store=store, registry=registry, policy=lambda: POLICY, redactor=Redactor(b"salt"))

    with caplog.at_level(logging.WARNING, logger="gateway.calls.pipeline"):
        p.prepare()

    (warning,) = caplog.records
    assert "files.write@1: tool name 'write file/ü' is not 1 to 128 of" in warning.getMessage()


def call(
    tool: str = "refund_order", amount: float = 10, key: str | None = "k1", who: Principal = ALICE
) -> CallInput:
    return CallInput(
        principal=who, tool_name=tool, arguments={"order_id": "1001", "amount": amount}, idempotency_key=key
    )


def nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


def event_types(store: Store, tool_call_id: str) -> list[str]:
    return [e.type for e in store.events(tool_call_id=tool_call_id)]


async def test_an_allowed_write_is_recorded_before_and_after_and_dispatched_once(
    pipeline: CallPipeline, store: Store, executor: FakeExecutor
) -> None:
    report = await pipeline.call(call())
    assert report.kind == "new" and report.call.status == "completed"
    assert report.call.result["structuredContent"] == {"refund_id": "r1"}
    assert event_types(store, report.call.tool_call_id) == [
        "tool_call.requested",
        "tool_call.dispatching",
        "tool_call.completed",
    ]
    assert len(executor.invocations) == 1
    # The backend gets the key scoped to alice, as the dispatch record says it was sent.
    sent = scoped_key("acme", "alice", "k1")
    assert executor.invocations[0].idempotency_key == sent == report.call.sent_key
    assert store.events(tool_call_id=report.call.tool_call_id)[1].payload["idempotency_key"] == sent


async def test_a_repeat_with_the_same_key_returns_the_recorded_call_without_dispatching(
    pipeline: CallPipeline, executor: FakeExecutor
) -> None:
    first = await pipeline.call(call())
    again = await pipeline.call(call())
    assert again.kind == "joined" and again.call.tool_call_id == first.call.tool_call_id
    assert len(executor.invocations) == 1


async def test_a_denied_call_never_reaches_the_executor(
    pipeline: CallPipeline, executor: FakeExecutor
) -> None:
    report = await pipeline.call(call(amount=5000))
    assert report.call.status == "denied" and report.call.reason == "amount_over_limit"
    assert executor.invocations == []


async def test_invalid_arguments_are_recorded_as_a_refusal_and_not_dispatched(
    pipeline: CallPipeline, store: Store, executor: FakeExecutor
) -> None:
    report = await pipeline.call(
        CallInput(principal=ALICE, tool_name="refund_order", arguments={"amount": "x"})
    )
    assert report.kind == "invalid_arguments"
    assert any("order_id" in e for e in report.validation_errors)
    assert any("amount" in e for e in report.validation_errors)
    assert event_types(store, report.call.tool_call_id) == ["tool_call.requested", "tool_call.denied"]
    assert executor.invocations == []


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({"order_id": "1001", "amount": float("nan")}, "amount: NaN is not a JSON number"),
        ({"order_id": "1001", "amount": float("inf")}, "amount: Infinity is not a JSON number"),
        ({"order_id": "1001", "amount": float("-inf")}, "amount: -Infinity is not a JSON number"),
        ({"order_id": "10\ud8001", "amount": 5}, "order_id: the string holds a lone surrogate"),
        ({"order_id": "1001", "amount": 5, "\udfff": 1}, "\\udfff: the key holds a lone surrogate"),
        ({"order_id": "1001", "amount": 5, "x": nested(300)}, "nested deeper than 64 levels"),
    ],
    ids=["nan", "infinity", "minus-infinity", "surrogate", "surrogate-key", "deep"],
)
async def test_arguments_that_are_not_json_are_refused_recorded_and_not_dispatched(
    pipeline: CallPipeline, store: Store, executor: FakeExecutor, arguments: dict, error: str
) -> None:
    # Python's JSON parser accepts NaN, Infinity and lone surrogate escapes; hashing and recording them
    # raised (ValueError, UnicodeEncodeError, pydantic's depth limit), so the client got an internal error
    # and the refusal was not recorded.
    report = await pipeline.call(CallInput(principal=ALICE, tool_name="refund_order", arguments=arguments))
    assert report.kind == "invalid_arguments" and report.call.status == "denied"
    assert any(error in e for e in report.validation_errors), report.validation_errors
    assert event_types(store, report.call.tool_call_id) == ["tool_call.requested", "tool_call.denied"]
    assert report.call.arguments["order_id"]  # a recordable copy of what was sent is in the log
    assert executor.invocations == []
    assert store.verify().ok


async def test_an_unknown_tool_raises_and_records_nothing(pipeline: CallPipeline, store: Store) -> None:
    with pytest.raises(UnknownTool):
        await pipeline.call(call(tool="drop_database"))
    assert store.events() == []


async def test_an_executor_that_raises_leaves_a_write_unknown_and_a_read_failed(
    pipeline: CallPipeline, executor: FakeExecutor
) -> None:
    executor.then(RuntimeError("bug"), RuntimeError("bug"))
    write = await pipeline.call(call())
    read = await pipeline.call(call(tool="lookup_order", key="k2"))
    assert (write.call.status, write.call.error) == ("result_unknown", "executor_error")
    assert (read.call.status, read.call.error) == ("failed", "executor_error")


async def test_an_executor_that_never_answers_is_bounded_and_the_write_is_unknown(
    pipeline: CallPipeline, executor: FakeExecutor
) -> None:
    executor.gate = anyio.Event()  # never set: the executor hangs
    with anyio.fail_after(5):
        report = await pipeline.call(call())
    assert report.call.status == "result_unknown" and report.call.error == "executor_timeout"


async def test_a_client_that_goes_away_mid_dispatch_still_leaves_the_outcome_recorded(
    pipeline: CallPipeline, store: Store, executor: FakeExecutor
) -> None:
    executor.gate = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(pipeline.call, call())
        await eventually(lambda: executor.invocations or store.list_calls(status="dispatching"), within_s=5)
        tg.cancel_scope.cancel()  # the client disconnects while the backend is working
        executor.gate.set()
    await eventually(lambda: store.list_calls(status="completed"), within_s=5)
    assert len(executor.invocations) == 1


async def test_an_identical_call_while_the_first_is_in_flight_joins_it_and_gets_its_outcome(
    pipeline: CallPipeline, executor: FakeExecutor
) -> None:
    executor.gate = anyio.Event()
    reports = []

    async def one() -> None:
        reports.append(await pipeline.call(call(key=None)))

    async with anyio.create_task_group() as tg:
        tg.start_soon(one)
        tg.start_soon(one)
        await eventually(lambda: executor.invocations, within_s=5)
        executor.gate.set()
    assert {r.call.tool_call_id for r in reports} == {reports[0].call.tool_call_id}
    assert {r.call.status for r in reports} == {"completed"}
    assert sorted(r.kind for r in reports) == ["joined", "new"]
    assert len(executor.invocations) == 1


async def test_redacted_arguments_are_stored_hashed_but_sent_in_clear(
    store: Store, executor: FakeExecutor
) -> None:
    secret = fake_capability("pay", effect="write", redact=("card",))
    registry = Registry({"fake": executor}, [secret])
    p = CallPipeline(store=store, registry=registry, policy=lambda: POLICY, redactor=Redactor(b"salt"))
    report = await p.call(CallInput(ALICE, "pay", {"card": "4111111111111111", "amount": 1}, "k"))
    assert executor.invocations[0].arguments["card"] == "4111111111111111"
    assert report.call.arguments["card"].startswith("redacted:")
    assert "4111111111111111" not in str([e.payload for e in store.events()])


async def test_an_identical_read_after_a_completed_one_is_asked_again_not_answered_from_the_log(
    pipeline: CallPipeline, executor: FakeExecutor
) -> None:
    first = await pipeline.call(call(tool="lookup_order", key=None))
    second = await pipeline.call(call(tool="lookup_order", key=None))
    assert first.call.tool_call_id != second.call.tool_call_id
    assert len(executor.invocations) == 2


async def test_a_redacted_field_named_in_the_summary_template_is_not_stored_in_clear(
    store: Store, executor: FakeExecutor
) -> None:
    secret = fake_capability(
        "pay", effect="write", redact=("card",), summary="charge card {card} for {amount}"
    )
    registry = Registry({"fake": executor}, [secret])
    p = CallPipeline(store=store, registry=registry, policy=lambda: POLICY, redactor=Redactor(b"salt"))
    report = await p.call(CallInput(ALICE, "pay", {"card": "4111111111111111", "amount": 1}, "k"))
    assert "4111111111111111" not in report.call.summary
    assert "4111111111111111" not in str([e.payload for e in store.events()])
