"""Upstream calls waiting on a 2026-07-28 client's input-required rounds (`gateway/mcp/parked.py`).

The rounds through the whole gateway, with the official client and HTTP and stdio upstreams, are in
`test_mcp_midcall.py`; these are the edges no client shows quickly: an answer that never comes, a
malformed or volunteered one, a shutdown with a call waiting, a state for another caller.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import anyio
import mcp_types as types
import pytest

from capabilities.mcp_midcall import REFUSED
from gateway.mcp.parked import GONE, NOT_ANSWERED, SHUT_DOWN, Exchange, Parked

pytestmark = pytest.mark.anyio

ASK = types.ElicitRequest(
    params=types.ElicitRequestFormParams(
        message="Name?", requested_schema={"type": "object", "properties": {}}
    )
)


@dataclass
class Who:
    tenant: str = "acme"
    subject: str = "ann"


class Relay:
    def __init__(self) -> None:
        self.cancelled = anyio.Event()

    def rebind(self, ctx: Any | None) -> None:
        pass

    def client_cancelled(self) -> None:
        self.cancelled.set()


def _exchange() -> Exchange:
    return Exchange("x1", "acme", "ann", "tool", Relay())


async def test_a_request_the_client_never_answers_is_refused_to_the_upstream_after_the_ttl() -> None:
    answer = await _exchange().ask("k", ASK, types.ElicitResult, ttl_s=0.05)
    assert isinstance(answer, types.ErrorData)
    assert answer.message == REFUSED + NOT_ANSWERED.format(0.05)


async def test_a_malformed_answer_is_asked_for_again_and_a_good_one_reaches_the_upstream() -> None:
    exchange = _exchange()
    got: list[Any] = []
    async with anyio.create_task_group() as group:

        async def upstream() -> None:
            got.append(await exchange.ask(None, ASK, types.ElicitResult, ttl_s=10))

        group.start_soon(upstream)
        with anyio.fail_after(5):
            first = await exchange.next()
        assert isinstance(first, types.InputRequiredResult)
        assert list(first.input_requests or {}) == ["writ/1"]
        sampled = types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text="x"), model="m"
        )
        exchange.answer({"writ/1": sampled})  # not an elicitation's answer
        with anyio.fail_after(5):
            again = await exchange.next()
        assert isinstance(again, types.InputRequiredResult)
        assert list(again.input_requests or {}) == ["writ/1"]
        assert json.loads(again.request_state or "")["r"] == 2
        exchange.answer({"writ/1": types.ElicitResult(action="decline")})
    assert got == [types.ElicitResult(action="decline")]


async def test_an_answer_the_client_volunteered_with_its_first_request_is_used_at_once() -> None:
    exchange = _exchange()
    exchange.offer({"user_name": types.ElicitResult(action="accept", content={"name": "Al"})})
    with anyio.fail_after(5):
        answer = await exchange.ask("user_name", ASK, types.ElicitResult, ttl_s=10)
    assert answer == types.ElicitResult(action="accept", content={"name": "Al"})


async def test_a_shutdown_refuses_what_the_upstream_waits_for_and_cancels_the_call() -> None:
    parked = Parked(ttl_s=600)
    relay = Relay()
    heard: list[Any] = []
    async with anyio.create_task_group() as group:
        group.start_soon(parked.serve)
        await anyio.sleep(0)  # the tasks group serves only once `serve` runs
        exchange_box: list[Exchange] = []

        async def call() -> str:
            heard.append(await exchange_box[0].ask("k", ASK, types.ElicitResult, ttl_s=600))
            await relay.cancelled.wait()
            return "recorded"

        with anyio.fail_after(5):
            while (opened := parked.open(Who(), "tool", relay, call)) is None:
                await anyio.sleep(0.01)
            exchange = opened
            exchange_box.append(exchange)
            assert isinstance(await exchange.next(), types.InputRequiredResult)
        group.cancel_scope.cancel()
    assert isinstance(heard[0], types.ErrorData)
    assert heard[0].message == REFUSED + SHUT_DOWN
    assert relay.cancelled.is_set()
    assert exchange.ended


async def test_a_rounds_state_is_good_only_for_its_caller_and_tool_in_this_process() -> None:
    parked = Parked(ttl_s=600)
    async with anyio.create_task_group() as group:
        group.start_soon(parked.serve)
        never = anyio.Event()

        async def call() -> None:
            with anyio.fail_after(10):  # the call a client cancels ends; this one ends when told
                await never.wait()

        with anyio.fail_after(5):
            while (exchange := parked.open(Who(), "tool", Relay(), call)) is None:
                await anyio.sleep(0.01)
        state = json.dumps({"v": 2, "x": exchange.id, "r": 1})
        assert parked.find(state, Who(), "tool") is exchange
        for who, tool in ((Who(subject="bob"), "tool"), (Who(tenant="other"), "tool"), (Who(), "other")):
            with pytest.raises(LookupError, match=re.escape(GONE)):
                parked.find(state, who, tool)
        with pytest.raises(LookupError, match=re.escape(GONE)):
            parked.find(json.dumps({"v": 2, "x": "elsewhere"}), Who(), "tool")
        assert parked.find(json.dumps({"v": 1, "tc": "a"}), Who(), "tool") is None  # a confirmation's
        assert parked.find("not json", Who(), "tool") is None
        never.set()
        group.cancel_scope.cancel()
