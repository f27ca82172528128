"""What the size-limit tests of MCP upstreams (HTTP and stdio) share: a timed call, and the verdict."""

from __future__ import annotations

import time

from capabilities.contract import Outcome
from capabilities.registry import Registry
from tests.capabilities.conftest import invocation

LIMIT = 256 * 1024
"""The upstreams' `max_response_bytes` in these tests."""


async def call(registry: Registry, tool: str) -> tuple[Outcome, float]:
    """Call `tool` once; its outcome and how long it took."""
    cap = registry.get(tool)
    assert cap is not None, tool
    started = time.monotonic()
    outcome = await registry.executor(cap).execute(invocation(cap, {"amount": 1}))
    return outcome, time.monotonic() - started


def assert_too_large(outcome: Outcome, kind: str) -> None:
    """An answer over the limit: unknown for a write (no result), failed for a read (an error result)."""
    assert (outcome.kind, outcome.error) == (kind, "response_too_large"), outcome
    assert outcome.detail is not None
    assert f"more than {LIMIT} bytes" in outcome.detail and "max_response_bytes" in outcome.detail
    if kind == "unknown":
        assert outcome.result is None
    else:
        assert outcome.result is not None and outcome.result.is_error
