"""The MCP executor against an upstream that lies (tests/capabilities/hostile_upstream.py), over stdio
and streamable HTTP: every call ends within the tool's timeout, `unknown` for a write the upstream may
have acted on and `failed` for a read, with an error saying what came back."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from capabilities.config import parse_config
from capabilities.registry import Registry
from tests.capabilities import hostile_upstream
from tests.capabilities.conftest import invocation
from tests.capabilities.servers import ServerState, serve

pytestmark = pytest.mark.anyio

SCRIPT = Path(hostile_upstream.__file__)
TIMEOUT_S = 1.0

WRITE = {
    "ok": ("completed", None),
    "error_result": ("unknown", "tool_error"),  # the upstream says the tool failed: perhaps after acting
    "malformed_result": ("unknown", "invalid_response"),
    "bad_schema": ("unknown", "invalid_response"),
    "nan": ("unknown", "invalid_response"),
    "internal_error": ("unknown", "upstream_internal_error"),  # -32603: the handler may have acted
    "invalid_params": ("failed", "mcp_error_32602"),  # -32602: refused before the handler ran
    "wrong_id": ("unknown", "response_timeout"),
}
"""Outcomes of a write, over either transport; a read gets `failed` wherever a write gets `unknown`."""

OVER_STDIO = {
    "garbage_then_answer": ("completed", None),  # a stray line does not end the session
    "garbage": ("unknown", "response_timeout"),  # a line that is not JSON-RPC is skipped, no answer came
    "not_jsonrpc": ("unknown", "response_timeout"),
    "exit": ("unknown", "connection_lost"),
    "hang": ("unknown", "response_timeout"),  # last: it blocks the process
}
OVER_HTTP = {
    "garbage": ("unknown", "invalid_response"),  # 200 with a body that is not JSON-RPC: was failed
    "not_jsonrpc": ("unknown", "invalid_response"),
    "garbage_then_answer": ("unknown", "invalid_response"),  # over HTTP the body is the garbage
    "wrong_content_type": ("unknown", "invalid_response"),
    "accepted_202": ("unknown", "invalid_response"),
    "redirect": ("unknown", "invalid_response"),  # to another origin: not followed
    "bad_sse": ("unknown", "invalid_response"),  # an event stream whose event is not JSON-RPC
    "exit": ("unknown", "upstream_internal_error"),  # the ASGI app raised: a 500
    "hang": ("unknown", "response_timeout"),
}


@pytest.fixture(scope="module")
def http_url() -> Iterator[str]:
    with serve(hostile_upstream.http_app(), ServerState()) as url:
        yield f"{url}/mcp"


def backend(transport: str, http_url: str, effect: str) -> dict[str, Any]:
    where: dict[str, Any] = (
        {"command": [sys.executable, str(SCRIPT)]} if transport == "stdio" else {"url": http_url}
    )
    return {"type": "mcp", **where, "timeout_s": 10, "defaults": {"effect": effect, "timeout_s": TIMEOUT_S}}


@pytest.mark.parametrize("effect", ["write", "read"])
@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_every_lie_ends_in_an_honest_outcome_within_the_timeout(
    transport: str, effect: str, http_url: str
) -> None:
    cases = {**WRITE, **(OVER_STDIO if transport == "stdio" else OVER_HTTP)}
    seen: dict[str, tuple[str, str | None]] = {}
    expected: dict[str, tuple[str, str | None]] = {}
    async with Registry.from_config(
        parse_config({"h": backend(transport, http_url, effect)}, []), environ={}
    ) as registry:
        for tool, (kind, error) in cases.items():
            cap = registry.get(tool)
            assert cap is not None, tool
            started = time.monotonic()
            outcome = await registry.executor(cap).execute(invocation(cap, {"amount": 1}))
            assert time.monotonic() - started < TIMEOUT_S + 1, tool
            seen[tool] = (outcome.kind, outcome.error)
            expected[tool] = ("failed" if effect == "read" and kind == "unknown" else kind, error)
            assert outcome.detail is None or outcome.detail.strip(), tool
            if outcome.kind == "unknown":
                assert outcome.result is None
            if outcome.error == "response_timeout":
                assert outcome.detail == f"h: no answer within {TIMEOUT_S:g}s"
            if tool == "nan":
                assert outcome.detail == "h: the result holds NaN or Infinity, which JSON cannot carry"

    assert seen == expected


async def test_a_stdio_server_that_exits_between_calls_is_started_again_for_the_next_one(
    http_url: str,
) -> None:
    async with Registry.from_config(
        parse_config({"h": backend("stdio", http_url, "write")}, []), environ={}
    ) as registry:
        cap, pid = registry.get("answer_then_exit"), registry.get("pid")
        assert cap is not None and pid is not None
        executor = registry.executor(cap)
        first = await executor.execute(invocation(pid, {}))
        done = await executor.execute(invocation(cap, {}))
        session = executor._sessions._current  # the session the exit should end
        assert session is not None
        with anyio.fail_after(5):
            await session.finished.wait()
        again = await executor.execute(invocation(pid, {}))

    assert done.kind == "completed"
    assert again.kind == "completed"  # was connection_lost: an unknown write that was never sent
    assert again.result is not None and first.result is not None
    assert again.result.content != first.result.content
