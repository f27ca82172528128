"""Which call an upstream's message belongs to, when its transport does not say (`MidCall`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import MCPError

from capabilities.mcp_midcall import (
    DETACHED,
    NO_CLIENT,
    UNATTRIBUTED,
    ClientCancelled,
    MidCall,
    is_refusal,
    refusal,
    relaying,
    until_cancelled,
)

pytestmark = pytest.mark.anyio

ASKED = types.ElicitRequestFormParams(message="Who?", requested_schema={"type": "object", "properties": {}})
LOGGED = types.LoggingMessageNotificationParams(level="info", data="hello")


class FakeRelay:
    """A call's client that accepts every request and remembers what reached it."""

    def __init__(self) -> None:
        self.cancelled = anyio.Event()
        self.heard: list[Any] = []

    async def progress(self, progress: float, total: float | None, message: str | None) -> None:
        self.heard.append(progress)

    async def log(self, params: types.LoggingMessageNotificationParams) -> None:
        self.heard.append(params)

    def log_level(self) -> types.LoggingLevel | None:
        return "debug"

    def declared(self) -> tuple[bool, bool]:
        return (True, True)

    async def passed_on(self) -> None:
        pass

    async def elicit(
        self, params: types.ElicitRequestParams, key: str | None = None
    ) -> types.ElicitResult | types.ErrorData:
        self.heard.append(params)
        return types.ElicitResult(action="decline")

    async def sample(self, params: types.CreateMessageRequestParams, key: str | None = None) -> Any:
        self.heard.append(params)
        return types.ErrorData(code=1, message="no model")

    def evidence(self) -> Mapping[str, Any]:
        return {}


async def test_a_message_goes_to_the_relay_of_the_task_that_sent_the_call() -> None:
    midcall, mine, other = MidCall("up"), FakeRelay(), FakeRelay()
    with midcall.flying(mine), midcall.flying(other), relaying(mine):
        answer = await midcall.on_elicit(None, ASKED)  # type: ignore[arg-type]
    assert answer == types.ElicitResult(action="decline")
    assert (mine.heard, other.heard) == ([ASKED], [])


async def test_without_a_context_the_one_call_in_flight_gets_it() -> None:
    midcall, only = MidCall("up"), FakeRelay()
    with midcall.flying(only):
        await midcall.on_log(LOGGED)
    assert only.heard == [LOGGED]


async def test_with_several_calls_in_flight_a_request_is_refused_and_a_log_dropped() -> None:
    midcall, one, two = MidCall("up"), FakeRelay(), FakeRelay()
    with midcall.flying(one), midcall.flying(two):
        answer = await midcall.on_elicit(None, ASKED)  # type: ignore[arg-type]
        await midcall.on_log(LOGGED)
    assert answer == refusal(UNATTRIBUTED)
    assert (one.heard, two.heard) == ([], [])


async def test_a_call_no_client_waits_on_counts_as_in_flight_and_gets_no_client() -> None:
    midcall, waiting = MidCall("up"), FakeRelay()
    with midcall.flying(None):
        alone = await midcall.on_elicit(None, ASKED)  # type: ignore[arg-type]
        with midcall.flying(waiting):
            beside = await midcall.on_elicit(None, ASKED)  # type: ignore[arg-type]
    assert alone == refusal(DETACHED)
    assert beside == refusal(UNATTRIBUTED)  # never given to the client of the other call
    assert waiting.heard == []


def test_writs_own_refusal_is_told_apart_from_an_upstream_error() -> None:
    ours = refusal(DETACHED)
    assert ours.code == NO_CLIENT
    assert is_refusal(MCPError(ours.code, ours.message))
    assert not is_refusal(MCPError(NO_CLIENT, "the upstream's own invalid request"))
    assert is_refusal(MCPError(NO_CLIENT, "Elicitation not supported"))


async def test_a_cancel_stops_the_call_and_says_so() -> None:
    relay = FakeRelay()

    async def forever() -> str:
        await anyio.sleep_forever()
        return "never"

    async def cancel_soon() -> None:
        await anyio.sleep(0.01)
        relay.cancelled.set()

    async with anyio.create_task_group() as group:
        group.start_soon(cancel_soon)
        with pytest.raises(ClientCancelled), anyio.fail_after(10):
            await until_cancelled(relay, forever)


async def test_a_call_that_ends_first_returns_its_answer_or_raises_its_error() -> None:
    relay = FakeRelay()

    async def answer() -> str:
        return "done"

    async def fail() -> str:
        raise MCPError(-32603, "boom")

    assert await until_cancelled(relay, answer) == "done"
    with pytest.raises(MCPError, match="boom"):
        await until_cancelled(relay, fail)
