"""Upstream calls that wait on a 2026-07-28 client's answers, asked in input-required rounds.

A 2026-07-28 client takes no request in the middle of a call: a server asks it in input-required
rounds (SEP-2322) instead, answering the call with `InputRequiredResult` (`inputRequests` and a
`requestState`) and going on when the client calls again with `inputResponses` and that state. When an
upstream asks for elicitation or sampling during such a client's call (mid-call, a 2025-11-25
upstream; in a round of its own, a 2026-07-28 upstream, which the SDK's client runs inside the call),
Writ keeps the upstream call open in a task of this process (`Parked.serve`), answers the client with
a round holding the upstream's request (under the upstream's own key when it asked in a round, else
`writ/<n>`), and hands each answer of the client's retry to the upstream; the retry is then answered
with the next round or with the call's result.

The call stays in this process: a retry that reaches another replica, or this one after a restart,
is refused as an expired round (-32602) and the client calls again; the call itself was recorded as
the upstream ended it. An upstream request the client does not answer within the TTL
(`confirmations.ttl_s`) is refused to the upstream (`NOT_ANSWERED`), as a legacy client's silence
would end in the upstream's own timeout.
"""

from __future__ import annotations

import contextvars
import json
import logging
import math
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
import anyio.lowlevel
import mcp_types as types
from anyio.streams.memory import MemoryObjectSendStream
from pydantic import ValidationError

from capabilities.mcp_midcall import refusal

logger = logging.getLogger(__name__)

STATE_VERSION = 2
"""The `v` of a round's own state (confirmation rounds are 1: `rounds.read_state`)."""
NOT_ANSWERED = "the client did not answer within {0:g}s"
SHUT_DOWN = "Writ is shutting down, so the client cannot be asked"
GONE = (
    "This input-required round is no longer open in this Writ process (answered already, expired, "
    "or begun at another replica or before a restart). Make the call again."
)
_SETTLE_CHECKPOINTS = 20
"""Scheduler turns given to an upstream's other requests of the same round before the client is asked."""

Asked = types.ElicitRequest | types.CreateMessageRequest


class Rebindable(Protocol):
    """The client side of the call (`midcall.ClientRelay`), pointed at each request of the client's."""

    def rebind(self, ctx: Any | None) -> None: ...

    def client_cancelled(self) -> None: ...


@dataclass
class _Ask:
    key: str
    request: Asked
    shape: Any
    answered: anyio.Event = field(default_factory=anyio.Event)
    answer: Any = None


class Exchange:
    """One call's rounds: what the upstream asks, waiting for the client's answers, and the end."""

    def __init__(self, exchange_id: str, tenant: str, subject: str, tool: str, relay: Rebindable) -> None:
        self.id = exchange_id
        self.tenant, self.subject, self.tool = tenant, subject, tool
        self.relay = relay
        self._round = 0
        self._asks: dict[str, _Ask] = {}
        self._numbered = 0
        self._changed = anyio.Event()
        self._ended: list[Any] = []
        self._offered: types.InputResponses = {}
        self.collected = anyio.Event()
        """Set once a client request was given the call's end (or it was refused): forget it then."""

    def _change(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    def offer(self, responses: types.InputResponses) -> None:
        """Answers the client gave with its first request, before it was asked (SEP-2322 lets a server
        use them): an upstream's request under one of these keys is answered with it at once."""
        self._offered = dict(responses)

    async def ask(self, key: str | None, request: Asked, shape: Any, ttl_s: float) -> Any:
        """The client's answer to `request` (for the upstream), or Writ's refusal if none came in time."""
        if key is not None and (offered := self._offered.pop(key, None)) is not None:
            answer = _valid(shape, offered)
            if answer is not None:
                return answer
        if key is None or key in self._asks:
            self._numbered += 1
            key = f"writ/{self._numbered}"
        ask = _Ask(key, request, shape)
        self._asks[key] = ask
        self._change()
        try:
            with anyio.move_on_after(ttl_s):
                await ask.answered.wait()
        finally:
            self._asks.pop(key, None)
        if not ask.answered.is_set():
            return refusal(NOT_ANSWERED.format(ttl_s))
        return ask.answer

    def answer(self, responses: types.InputResponses) -> None:
        """Hand the upstream the answers the client gave to requests still waiting (others ignored; a
        malformed one is asked again)."""
        for key, response in responses.items():
            ask = self._asks.get(key)
            if ask is None or ask.answered.is_set():
                continue
            answer = _valid(ask.shape, response)
            if answer is None:
                logger.info("input-required answer %r for %s is malformed: asked again", key, self.tool)
                continue
            ask.answer = answer
            ask.answered.set()

    def refuse_all(self, reason: str) -> None:
        """Answer every waiting request with Writ's refusal (the upstream hears `reason`)."""
        for ask in self._asks.values():
            if not ask.answered.is_set():
                ask.answer = refusal(reason)
                ask.answered.set()

    @property
    def ended(self) -> bool:
        return bool(self._ended)

    def end(self, answer: Any) -> None:
        """The call's end: the client's answer (a result), or the exception to raise to it."""
        self._ended.append(answer)
        self._change()

    async def next(self) -> Any:
        """The client's answer now: a round of the requests still waiting, or the call's end.

        Raises:
            Exception: the call ended in an error its client is to be given.
        """
        while True:
            changed = self._changed
            waiting = {k: a for k, a in self._asks.items() if not a.answered.is_set()}
            if waiting:
                # The upstream's requests of one round arrive together (the SDK's client dispatches
                # them concurrently): give its siblings a few turns to join this round.
                for _ in range(_SETTLE_CHECKPOINTS):
                    await anyio.lowlevel.checkpoint()
                waiting = {k: a for k, a in self._asks.items() if not a.answered.is_set()}
                if waiting:
                    return self._round_of(waiting)
            if self._ended:
                self.collected.set()
                ended = self._ended[0]
                if isinstance(ended, Exception):
                    raise ended
                return ended
            await changed.wait()

    def _round_of(self, waiting: dict[str, _Ask]) -> types.InputRequiredResult:
        self._round += 1
        state = {"v": STATE_VERSION, "x": self.id, "r": self._round}
        return types.InputRequiredResult(
            input_requests={key: ask.request for key, ask in waiting.items()},
            request_state=json.dumps(state, separators=(",", ":")),
        )


async def reply(exchange: Exchange) -> Any:
    """The client's request answered: the next round of what the upstream asks, or the call's answer
    once it ended. A client that gives up on this request (cancels it) cancels the call, as it would a
    call without rounds."""
    try:
        return await exchange.next()
    except anyio.get_cancelled_exc_class():
        if not exchange.ended:
            exchange.relay.client_cancelled()
        raise
    finally:
        exchange.relay.rebind(None)


def _valid(shape: Any, response: types.InputResponse) -> Any:
    """The client's answer in the shape the upstream asked for, None if it is not one."""
    try:
        return shape.model_validate(response.model_dump(mode="json", by_alias=True, exclude_none=True))
    except ValidationError:
        return None


class Parked:
    """The exchanges of this process, and the task group their upstream calls run in."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._exchanges: dict[str, Exchange] = {}
        self._send: MemoryObjectSendStream[Callable[[], Coroutine[Any, Any, None]]] | None = None

    async def serve(self) -> None:
        """Run the parked calls until cancelled; then each waiting upstream request is refused and its
        call cancelled, and the calls are let end (and be recorded) before this returns."""
        send, receive = anyio.create_memory_object_stream[Callable[[], Coroutine[Any, Any, None]]](math.inf)
        self._send = send
        async with send, receive, anyio.create_task_group() as group:
            try:
                async for job in receive:
                    group.start_soon(job)
            finally:
                self._send = None
                for exchange in list(self._exchanges.values()):
                    if not exchange.ended:
                        exchange.refuse_all(SHUT_DOWN)
                        exchange.relay.client_cancelled()

    def open(
        self, who: Any, tool: str, relay: Rebindable, run: Callable[[], Awaitable[Any]]
    ) -> Exchange | None:
        """Run `run()` (the call) in this process's task group: None if it does not serve."""
        if self._send is None:
            return None
        exchange = Exchange(uuid.uuid4().hex, who.tenant, who.subject, tool, relay)
        self._exchanges[exchange.id] = exchange
        context = contextvars.copy_context()  # the request's: its trace, its principal, ...

        async def job() -> None:
            for var, value in context.items():  # in this task's own copy of the context only
                var.set(value)
            try:
                with anyio.CancelScope(shield=True):  # recorded to its end; `serve` cancels it upstream
                    try:
                        exchange.end(await run())
                    except Exception as exc:  # handed to the client's request, which raises it
                        exchange.end(exc)
                with anyio.move_on_after(self.ttl_s):
                    await exchange.collected.wait()
            finally:
                self._exchanges.pop(exchange.id, None)

        self._send.send_nowait(job)
        return exchange

    def find(self, state: str, who: Any, tool: str) -> Exchange | None:
        """The exchange a retry's (unsealed) `requestState` names, None if the state is not a relay
        round's.

        Raises:
            LookupError: it is one, but not open here for this caller and tool (`GONE`).
        """
        try:
            parsed = json.loads(state)
            if not isinstance(parsed, dict) or parsed.get("v") != STATE_VERSION:
                return None
            exchange_id = parsed["x"]
        except (ValueError, KeyError):
            return None
        exchange = self._exchanges.get(exchange_id) if isinstance(exchange_id, str) else None
        if exchange is None or exchange.collected.is_set():
            raise LookupError(GONE)
        if (exchange.tenant, exchange.subject, exchange.tool) != (who.tenant, who.subject, tool):
            raise LookupError(GONE)
        return exchange
