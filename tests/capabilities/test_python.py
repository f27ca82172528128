"""The Python executor: sync and async callables, result shapes, exceptions, derived schemas."""

from __future__ import annotations

import json
import threading
from typing import Any

import anyio
import pytest

from capabilities.config import parse_config
from capabilities.contract import CapabilityError, ConfigError, Outcome, ToolResult
from capabilities.registry import Registry
from tests.capabilities.conftest import invocation

pytestmark = pytest.mark.anyio

MODULE = "tests.capabilities.sample_tools"


def build(*entries: dict[str, Any]) -> Registry:
    capabilities = [{"backend": "local", "effect": "read", **entry} for entry in entries]
    return Registry.from_config(parse_config({"local": {"type": "python"}}, capabilities), environ={})


async def run(registry: Registry, tool: str, arguments: dict[str, Any] | None = None) -> Outcome:
    cap = registry.get(tool)
    assert cap is not None
    return await registry.executor(cap).execute(invocation(cap, arguments))


async def test_a_sync_function_runs_in_a_worker_thread_and_a_dict_becomes_structured_json() -> None:
    registry = build(
        {"id": "add", "callable": f"{MODULE}:add"}, {"id": "where", "callable": f"{MODULE}:thread_name"}
    )
    async with registry:
        added = await run(registry, "add", {"a": 2, "b": 3})
        where = await run(registry, "where")

    assert added.kind == "completed"
    assert added.result == ToolResult(content=({"type": "text", "text": '{"sum":5}'},), structured={"sum": 5})
    assert where.result is not None
    assert where.result.content[0]["text"] != threading.current_thread().name


async def test_an_async_function_is_awaited_and_a_string_becomes_text() -> None:
    async with build({"id": "greet", "callable": f"{MODULE}:greet"}) as registry:
        outcome = await run(registry, "greet", {"name": "ada"})

    assert outcome.result == ToolResult(content=({"type": "text", "text": "hello ada"},))


async def test_other_values_become_json_text_and_a_tool_result_passes_through() -> None:
    registry = build(
        {"id": "numbers", "callable": f"{MODULE}:numbers"}, {"id": "rich", "callable": f"{MODULE}:rich"}
    )
    async with registry:
        numbers = await run(registry, "numbers", {"n": 3})
        rich = await run(registry, "rich")

    assert numbers.result == ToolResult(content=({"type": "text", "text": "[0,1,2]"},))
    assert rich.result == ToolResult(content=({"type": "text", "text": "as is"},), structured={"kept": True})


async def test_values_json_cannot_hold_are_given_as_text_so_the_result_can_be_recorded() -> None:
    # A datetime or Decimal in the result used to reach the store as is, which cannot serialize it,
    # and NaN became invalid JSON.
    async with build({"id": "ledger", "callable": f"{MODULE}:ledger_entry"}) as registry:
        outcome = await run(registry, "ledger")

    assert outcome.kind == "completed" and outcome.result is not None
    assert outcome.result.structured == {
        "at": "2026-11-30 12:00:00+00:00",
        "amount": "12.50",
        "id": "12345678-1234-5678-1234-567812345678",
        "ratio": "nan",
        "tags": ["a", "b"],
        "pair": [1, 2],
        "3": "an int key",
    }
    assert json.loads(json.dumps(outcome.result.to_json(), allow_nan=False)) == outcome.result.to_json()


async def test_lone_surrogates_and_absurd_nesting_are_given_as_text_so_the_result_can_be_recorded() -> None:
    # A lone surrogate raised when the outcome was hashed (an internal error, the effect done and
    # unrecorded), and the repr of a structure 5000 deep raised RecursionError.
    async with build({"id": "unstorable", "callable": f"{MODULE}:unstorable"}) as registry:
        outcome = await run(registry, "unstorable")

    assert outcome.kind == "completed" and outcome.result is not None
    structured = outcome.result.structured
    assert structured is not None and structured["name"] == "\\ud800" and structured["\\udcff"] == 1
    json.dumps(outcome.result.to_json(), ensure_ascii=False).encode("utf-8")  # as the store writes it


async def test_an_exception_is_failed_with_its_type_and_message() -> None:
    async with build({"id": "explode", "callable": f"{MODULE}:explode", "effect": "write"}) as registry:
        outcome = await run(registry, "explode", {"reason": "no"})

    assert (outcome.kind, outcome.error) == ("failed", "exception")
    assert outcome.detail == "ValueError: cannot do that: no"
    assert outcome.result is not None and outcome.result.is_error


async def test_sys_exit_or_keyboard_interrupt_in_a_callable_is_failed_not_raised() -> None:
    # They passed `except Exception`: a bare 500 to the client, and the call left dispatching.
    capabilities = [
        {"id": "exits", "callable": f"{MODULE}:exits"},
        {"id": "exits-async", "callable": f"{MODULE}:exits_async"},
    ]
    async with build(*capabilities) as registry:
        exited = await run(registry, "exits", {"how": "exit"})
        interrupted = await run(registry, "exits", {"how": "interrupt"})
        exited_async = await run(registry, "exits-async")

    assert (exited.kind, exited.error, exited.detail) == ("failed", "exception", "SystemExit: 3")
    assert (interrupted.kind, interrupted.detail) == ("failed", "KeyboardInterrupt: ")
    assert (exited_async.kind, exited_async.detail) == ("failed", "SystemExit: 4")


async def test_wrong_arguments_are_failed_not_raised() -> None:
    async with build({"id": "add", "callable": f"{MODULE}:add"}) as registry:
        outcome = await run(registry, "add", {"c": 1})

    assert (outcome.kind, outcome.error) == ("failed", "exception")
    assert outcome.detail is not None and outcome.detail.startswith("TypeError")


def test_the_input_schema_is_derived_from_the_signature_unless_given() -> None:
    given = {"type": "object", "properties": {"a": {"type": "integer"}}}
    registry = build(
        {"id": "add", "callable": f"{MODULE}:add"},
        {"id": "add2", "tool": "add_given", "callable": f"{MODULE}:add", "input_schema": given},
    )

    derived = registry.get("add")
    assert derived is not None
    assert derived.input_schema["properties"]["a"]["type"] == "integer"
    assert derived.input_schema["required"] == ["a"]
    assert registry.get("add_given").input_schema == given  # type: ignore[union-attr]


def test_a_callables_description_is_its_docstrings_first_paragraph_unless_the_config_gives_one() -> None:
    registry = build(
        {"id": "words", "callable": f"{MODULE}:word_count"},
        {"id": "words2", "tool": "words_given", "callable": f"{MODULE}:word_count", "description": "Mine."},
        {"id": "hold", "callable": f"{MODULE}:hold"},
    )

    assert registry.get("words").description == "Count the words of a text, split on white space."  # type: ignore[union-attr]
    assert registry.get("words_given").description == "Mine."  # type: ignore[union-attr]
    hold = registry.get("hold")
    assert hold is not None and "\n" not in hold.description


def test_a_module_that_cannot_be_imported_says_where_modules_are_looked_for() -> None:
    with pytest.raises(ConfigError, match=r"\$PYTHONPATH, not from the config's directory"):
        build({"id": "broken", "callable": "mytools:word_count"})


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("tests.capabilities.no_such_module:add", "cannot import module"),
        (f"{MODULE}:missing", "has no attribute"),
        (f"{MODULE}:NOT_CALLABLE", "not callable"),
    ],
)
def test_a_callable_that_cannot_be_imported_is_a_config_error_naming_the_capability(
    ref: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        build({"id": "broken", "callable": ref})
    assert "'broken'" in str(caught.value)


async def test_python_capabilities_cannot_be_reconciled() -> None:
    async with build({"id": "add", "callable": f"{MODULE}:add"}) as registry:
        cap = registry.get("add")
        assert cap is not None
        with pytest.raises(CapabilityError):
            await registry.executor(cap).reconcile(invocation(cap, {"a": 1}))


@pytest.fixture
def release_blocked() -> Any:
    from tests.capabilities import sample_tools

    sample_tools.RELEASE.clear()
    yield
    sample_tools.RELEASE.set()  # let the abandoned thread finish


@pytest.mark.parametrize(("tool", "effect"), [("block", "write"), ("stall", "write"), ("block", "read")])
async def test_a_callable_that_hangs_ends_at_the_capability_timeout(
    release_blocked: Any, tool: str, effect: str
) -> None:
    registry = build({"id": tool, "callable": f"{MODULE}:{tool}", "effect": effect, "timeout_s": 0.3})
    async with registry:
        started = anyio.current_time()
        with anyio.fail_after(5):  # without a timeout of its own, `stall` would hang the test
            outcome = await run(registry, tool)
        elapsed = anyio.current_time() - started

    assert elapsed < 1.5  # `block` gives up by itself after 3s; the timeout must come first
    assert outcome.error == "timeout"
    assert outcome.detail == f"{tool}@1 did not return within 0.3s"
    if effect == "write":
        assert outcome.kind == "unknown" and outcome.result is None  # it may have acted meanwhile
    else:
        assert outcome.kind == "failed" and outcome.result is not None and outcome.result.is_error


def backend_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("writ-python-capped")]


@pytest.fixture
def capped(release_blocked: Any) -> Registry:
    from tests.capabilities import sample_tools

    sample_tools.HELD.clear()
    capabilities = [
        {"id": "hold", "callable": f"{MODULE}:hold", "effect": "write", "timeout_s": 0.5},
        {"id": "add", "callable": f"{MODULE}:add", "effect": "read", "timeout_s": 2},
    ]
    return Registry.from_config(
        parse_config(
            {"capped": {"type": "python", "max_threads": 2}},
            [{"backend": "capped", **c} for c in capabilities],
        ),
        environ={},
    )


async def test_hung_callables_hold_at_most_max_threads_and_a_call_with_none_free_never_starts(
    capped: Registry,
) -> None:
    from tests.capabilities import sample_tools

    outcomes: dict[int, Outcome] = {}

    async def call(n: int) -> None:
        outcomes[n] = await run(capped, "hold")

    async with capped:
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tasks:
                for n in (1, 2):
                    tasks.start_soon(call, n)
                while len(sample_tools.HELD) < 2:  # both threads are taken before the third call
                    await anyio.sleep(0.01)
                tasks.start_soon(call, 3)

        for n in (1, 2):
            assert (outcomes[n].kind, outcomes[n].error) == ("unknown", "timeout")
        third = outcomes[3]
        assert (third.kind, third.error) == ("failed", "threads_busy")  # a write, yet nothing ran
        assert third.detail == (
            "hold@1 did not start within 0.5s: all 2 threads of python backend 'capped' (max_threads) "
            "are held by calls that have not returned; nothing ran"
        )
        assert third.result is not None and third.result.is_error
        assert len(sample_tools.HELD) == 2
        assert len(backend_threads()) == 2  # not one abandoned thread per call

        sample_tools.RELEASE.set()  # the hung callables return, and their threads serve calls again
        with anyio.fail_after(5):
            added = await run(capped, "add", {"a": 1, "b": 2})
        assert added.kind == "completed"
        assert len(sample_tools.HELD) == 2  # the third never started, not even late
        assert len(backend_threads()) <= 2


async def test_a_call_waiting_for_a_thread_runs_once_one_frees_within_its_timeout(capped: Registry) -> None:
    from tests.capabilities import sample_tools

    async with capped:
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tasks:
                for _ in range(2):
                    tasks.start_soon(run, capped, "hold")
                while len(sample_tools.HELD) < 2:
                    await anyio.sleep(0.01)
                tasks.start_soon(release_after, 0.3)
                started = anyio.current_time()
                added = await run(capped, "add", {"a": 1, "b": 2})  # in line until a thread frees
                waited = anyio.current_time() - started

    assert added.kind == "completed"
    assert waited >= 0.25


async def release_after(seconds: float) -> None:
    from tests.capabilities import sample_tools

    await anyio.sleep(seconds)
    sample_tools.RELEASE.set()
