"""The MCP executor against a stdio upstream whose messages are too long to hold
(tests/capabilities/hostile_upstream.py run as a child process).

A message longer than the backend's `max_response_bytes` is not held: the answer of a call is
`response_too_large` (`unknown` for a write, `failed` for a read, an inconclusive lookup). One that
ends within 16 times the limit is skipped to its newline and the same server serves the next call; a
longer one (a flood, or a line that never ends) closes the session, and the next call starts the
server again.
"""

from __future__ import annotations

import sys
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from capabilities.config import parse_config
from capabilities.contract import Outcome
from capabilities.registry import Registry
from tests.capabilities import hostile_upstream
from tests.capabilities.conftest import invocation
from tests.capabilities.limits import LIMIT, assert_too_large, call

pytestmark = pytest.mark.anyio

SCRIPT = Path(hostile_upstream.__file__)
BIG = 2 * 1024 * 1024
"""Within the bound a long message is skipped to its end (16 * LIMIT)."""
FLOOD = 64 * 1024 * 1024
TIMEOUT_S = 5.0
FLOODS = ["big", "flood", "flood_no_newline"]


@pytest.fixture
async def registry() -> AsyncIterator[Registry]:
    common = {
        "type": "mcp",
        "command": [sys.executable, str(SCRIPT)],
        "env": {"BIG_BYTES": str(BIG), "FLOOD_BYTES": str(FLOOD), "EXACT_BYTES": str(LIMIT)},
        "timeout_s": 10,
        "max_response_bytes": LIMIT,
    }
    backends = {
        "w": {
            **common,
            "tools": [*FLOODS, "big_then_answer", "pid", "exact", "stderr_noise"],
            "defaults": {
                "effect": "write",
                "timeout_s": TIMEOUT_S,
                "reconcile": {"tool": "big", "arguments": {"key": "{idempotency_key}"}},
            },
            "overrides": {name: {"effect": "read"} for name in ("pid", "exact", "stderr_noise")},
        },
        "r": {
            **common,
            "tools": [*FLOODS, "pid"],
            "rename": {name: f"read_{name}" for name in [*FLOODS, "pid"]},
            "defaults": {"effect": "read", "timeout_s": TIMEOUT_S},
        },
    }
    async with Registry.from_config(parse_config(backends, []), environ={}) as built:
        yield built


async def pid(registry: Registry, tool: str = "pid") -> str:
    """The process id of the server answering (so a restart shows), asserting that it answers."""
    outcome, _ = await call(registry, tool)
    assert outcome.kind == "completed", outcome
    assert outcome.result is not None
    return str(outcome.result.content[0]["text"])


async def test_an_answer_over_the_limit_is_given_up_and_the_same_server_serves_the_next_call(
    registry: Registry,
) -> None:
    before = await pid(registry), await pid(registry, "read_pid")
    tracemalloc.start()
    try:
        write, _ = await call(registry, "big")  # its id comes last, after the 2 MB: known at the newline
        read, _ = await call(registry, "read_big")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert_too_large(write, "unknown")  # the upstream answered: it may well have acted
    assert_too_large(read, "failed")
    assert peak < BIG  # never held whole
    assert (await pid(registry), await pid(registry, "read_pid")) == before  # skipped, not restarted


async def test_a_call_in_flight_beside_an_answer_over_the_limit_gets_its_own_answer(
    registry: Registry,
) -> None:
    before = await pid(registry)
    outcomes: dict[str, Outcome] = {}

    async def run(tool: str) -> None:
        outcomes[tool], _ = await call(registry, tool)

    async with anyio.create_task_group() as group:
        group.start_soon(run, "big")
        group.start_soon(run, "pid")

    assert_too_large(outcomes["big"], "unknown")
    assert outcomes["pid"].kind == "completed" and outcomes["pid"].result is not None
    assert outcomes["pid"].result.content[0]["text"] == before


async def test_a_long_message_no_call_waits_for_is_skipped_and_the_answer_after_it_is_read(
    registry: Registry,
) -> None:
    before = await pid(registry)
    tracemalloc.start()
    try:
        outcome, _ = await call(registry, "big_then_answer")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert outcome.kind == "completed", outcome
    assert peak < BIG
    assert outcome.result is not None and outcome.result.content[0]["text"] == "done"
    assert await pid(registry) == before


@pytest.mark.parametrize(
    "flood",
    ["flood", "flood_no_newline"],
    ids=["a 64 MB line", "a line that never ends"],
)
async def test_a_flood_is_given_up_at_the_limit_without_holding_it_and_the_next_call_starts_the_server_again(
    registry: Registry, flood: str
) -> None:
    before = await pid(registry), await pid(registry, "read_pid")
    tracemalloc.start()
    try:
        write, write_s = await call(registry, flood)
        read, read_s = await call(registry, f"read_{flood}")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert_too_large(write, "unknown")
    assert_too_large(read, "failed")
    assert write_s < TIMEOUT_S and read_s < TIMEOUT_S
    assert peak < 32 * 1024 * 1024
    after = await pid(registry), await pid(registry, "read_pid")  # the next call works ...
    assert after[0] != before[0] and after[1] != before[1]  # ... on a server started again


async def test_an_answer_of_exactly_the_limit_is_read(registry: Registry) -> None:
    outcome, _ = await call(registry, "exact")

    assert outcome.kind == "completed", outcome
    assert outcome.result is not None
    assert len(outcome.result.content[0]["text"]) > LIMIT - 100


async def test_a_lookup_answered_with_a_message_over_the_limit_is_inconclusive(registry: Registry) -> None:
    cap = registry.get("flood")
    assert cap is not None and cap.reconcilable

    found = await registry.executor(cap).reconcile(invocation(cap, {"amount": 1}))

    assert found.verdict == "inconclusive"
    assert found.evidence["error"] == "response_too_large"
    assert await pid(registry)


async def test_a_server_writing_a_megabyte_to_stderr_is_not_blocked_on_it(registry: Registry) -> None:
    outcome, took = await call(registry, "stderr_noise")

    assert outcome.kind == "completed", outcome
    assert took < TIMEOUT_S
