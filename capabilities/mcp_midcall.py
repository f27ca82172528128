"""What an upstream MCP server says during one call, routed to the client that made the call.

An upstream may send progress, log messages, and requests of its own (elicitation, sampling) while a
call is in flight. The executor keeps one client session per upstream (over HTTP, one per set of
client capabilities) for many calls, so each of these has to find the call it belongs to:

- progress carries the token the SDK put on the call, so it always finds it;
- the rest is handled with the context of the task that sent the call where the transport keeps it:
  streamable HTTP answers a request on that request's own stream, and a 2026-07-28 upstream's
  input-required rounds run in the calling task; over stdio in the 2025-11-25 era the messages carry
  nothing that names the call, so they go to the one call in flight on that upstream, and when there
  are several, a request is refused and a log message dropped (logged here) rather than given to a
  client that did not make the call.

The gateway hands each call a `CallRelay` (its client, the capability's privacy rules) with
`relaying()`; this module never sees an MCP server or the log.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any, Protocol, TypeVar

import anyio
import mcp_types as types
from mcp import MCPError
from mcp.client.session import ClientRequestContext

logger = logging.getLogger(__name__)

NO_CLIENT = -32600
"""The JSON-RPC code of Writ's refusals of an upstream's request (invalid request, for this call)."""

UNATTRIBUTED = (
    "Writ cannot tell which call this request belongs to (several calls are in flight on this "
    "upstream, and its transport does not say), so it is not passed to any client"
)
DETACHED = "no client is waiting on this call (it runs without one, e.g. after an approval)"

Declared = tuple[bool, bool]
"""Whether a client declared (elicitation, sampling): what an upstream is told it can be asked."""
ALL_DECLARED: Declared = (True, True)

SamplingAnswer = types.CreateMessageResult | types.CreateMessageResultWithTools | types.ErrorData


class CallRelay(Protocol):
    """The client side of one call: where what the upstream says goes, and what the call records."""

    cancelled: anyio.Event
    """Set when the client cancels the call: the executor then cancels its upstream request."""

    async def progress(self, progress: float, total: float | None, message: str | None) -> None:
        """Pass the upstream's progress on, under the client's own progress token (if it gave one)."""

    async def log(self, params: types.LoggingMessageNotificationParams) -> None:
        """Pass a log message on if the client asked for its level."""

    def log_level(self) -> types.LoggingLevel | None:
        """The lowest level the client wants on a 2026-07-28 request; None: none asked."""

    def declared(self) -> Declared:
        """Whether the client declared (elicitation, sampling), so the upstream is told the same."""

    async def passed_on(self) -> None:
        """Return once what the upstream said so far reached the client (bounded)."""

    async def elicit(
        self, params: types.ElicitRequestParams, key: str | None = None
    ) -> types.ElicitResult | types.ErrorData:
        """Ask the client (its user) what the upstream asks, or refuse it to the upstream. `key` is the
        upstream's name for the request when it asked in an input-required round of its own."""

    async def sample(
        self, params: types.CreateMessageRequestParams, key: str | None = None
    ) -> SamplingAnswer:
        """Ask the client's model what the upstream asks, or refuse it to the upstream."""

    def evidence(self) -> Mapping[str, Any]:
        """What the call records of this: the requests asked, their answers, progress and log counts."""


_current: ContextVar[CallRelay | None] = ContextVar("writ_call_relay", default=None)


@contextlib.contextmanager
def relaying(relay: CallRelay) -> Iterator[None]:
    """Calls made in this block (in this task) relay to `relay`."""
    token = _current.set(relay)
    try:
        yield
    finally:
        _current.reset(token)


def current_relay() -> CallRelay | None:
    return _current.get()


def refusal(text: str) -> types.ErrorData:
    """Writ's answer to an upstream's request it does not pass on."""
    return types.ErrorData(code=NO_CLIENT, message=f"{REFUSED}{text}")


def is_refusal(exc: MCPError) -> bool:
    """Whether a call failed on Writ's own refusal (a 2026-07-28 round's request raises it back), or on
    the SDK client's own answer to a request for a capability its session does not state."""
    return exc.code == NO_CLIENT and (exc.message.startswith(REFUSED) or exc.message in NOT_STATED)


REFUSED = "Writ: "
NOT_STATED = ("Elicitation not supported", "Sampling not supported")
"""How the SDK's client answers (-32600) a request for elicitation or sampling made without the
callback, i.e. on a session that told the upstream its client cannot be asked
(tests/capabilities/test_mcp_sdk_errors.py pins the wording)."""
_T = TypeVar("_T")


class ClientCancelled(Exception):
    """The client cancelled the call before the upstream answered."""


async def until_cancelled(relay: CallRelay | None, call: Callable[[], Awaitable[_T]]) -> _T:
    """`call()`, cancelled (the SDK then cancels its request upstream) if the client cancels first.

    Raises:
        ClientCancelled: the client cancelled first.
    """
    if relay is None:
        return await call()
    cancelled = relay.cancelled
    done: list[tuple[_T | None, Exception | None]] = []
    async with anyio.create_task_group() as group:

        async def run() -> None:
            try:
                done.append((await call(), None))
            except Exception as exc:  # handed back to the caller, outside the task group
                done.append((None, exc))
            group.cancel_scope.cancel()

        async def watch() -> None:
            await cancelled.wait()
            group.cancel_scope.cancel()

        group.start_soon(run)
        group.start_soon(watch)
    if not done:
        raise ClientCancelled
    value, error = done[0]
    if error is not None:
        raise error
    return value  # type: ignore[return-value]  # set together with error None


class MidCall:
    """One upstream's client callbacks (`Client(logging_callback=..., ...)`), routing each message to
    the call it belongs to."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._flying: list[CallRelay | None] = []
        """The calls in flight on this upstream: their relays, None for one no client waits on."""

    @contextlib.contextmanager
    def flying(self, relay: CallRelay | None) -> Iterator[None]:
        """The block is one call in flight on this upstream."""
        self._flying.append(relay)
        try:
            yield
        finally:
            self._flying.remove(relay)

    def _relay(self) -> CallRelay | str:
        """The relay of the call this message belongs to; a reason text when there is none to tell."""
        relay = current_relay()
        if relay is not None:
            return relay
        if len(self._flying) > 1:
            return UNATTRIBUTED
        if self._flying and self._flying[0] is not None:
            return self._flying[0]
        return DETACHED

    async def on_log(self, params: types.LoggingMessageNotificationParams) -> None:
        relay = self._relay()
        if isinstance(relay, str):
            logger.info("mcp backend %r: log message not relayed: %s", self._name, relay)
            return
        await relay.log(params)

    async def on_elicit(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult | types.ErrorData:
        relay = self._relay()
        if isinstance(relay, str):
            logger.warning("mcp backend %r: elicitation refused: %s", self._name, relay)
            return refusal(relay)
        return await relay.elicit(params, _round_key(context))

    async def on_sample(
        self, context: ClientRequestContext, params: types.CreateMessageRequestParams
    ) -> SamplingAnswer:
        relay = self._relay()
        if isinstance(relay, str):
            logger.warning("mcp backend %r: sampling request refused: %s", self._name, relay)
            return refusal(relay)
        return await relay.sample(params, _round_key(context))


def _round_key(context: ClientRequestContext) -> str | None:
    """The upstream's key for its request in a 2026-07-28 input-required round (the SDK's client puts
    it where a mid-call request has its JSON-RPC id, a number), None for a mid-call request."""
    request_id = getattr(context, "request_id", None)
    return request_id if isinstance(request_id, str) else None
