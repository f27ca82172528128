"""The client side of a call to an upstream MCP tool: what the upstream says during it reaches the
client that made it (progress, log messages at the client's level, elicitation and sampling where the
client declared them: mid-call to a 2025-11-25 client, in input-required rounds to a 2026-07-28 one,
`parked.py`), and a client's cancel reaches the upstream.

What the call records of it (`ClientRelay.evidence`, in the outcome's evidence as `relayed`): each
elicitation (its message, the requested schema, the action and the content, each field the capability
redacts as its salted hash) and sampling request (its messages, the model and stop reason answered),
refusals with their reason, a cancel by either side, and how many progress notifications and log
messages were passed on (not their text).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from typing import Any, Protocol, get_args

import anyio
import mcp_types as types
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from mcp_types import LOG_LEVEL_META_KEY
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from capabilities.contract import Capability
from capabilities.mcp_midcall import REFUSED, Declared, SamplingAnswer, refusal
from gateway.calls.actions import Redactor
from gateway.mcp.sdk import connection_of

logger = logging.getLogger(__name__)

LEVELS: tuple[types.LoggingLevel, ...] = get_args(types.LoggingLevel)
"""The syslog levels, least severe first."""
DEFAULT_LEVEL: types.LoggingLevel = "info"
"""What a 2025-11-25 client that never sent `logging/setLevel` is given."""
_LEVEL_STATE = "writ/logLevel"
PASS_ON_WAIT_S = 5.0
"""The longest a call's answer waits for its progress and log messages to reach a slow client."""
# What `declared` asks the client's session about, for every call to an upstream: built once (the
# session only reads them).
_ELICITATION = types.ClientCapabilities(elicitation=types.ElicitationCapability())
_SAMPLING = types.ClientCapabilities(sampling=types.SamplingCapability())

NOT_DECLARED = "the client did not declare the {0} capability, so Writ cannot ask it"
NO_BACK_CHANNEL = (
    "Writ cannot ask its client mid-call on this connection (a 2026-07-28 client is asked only in "
    "input-required rounds, and this call cannot wait for one)"
)


class Rounds(Protocol):
    """Where a 2026-07-28 client is asked: input-required rounds of its call (`parked.Exchange`)."""

    async def ask(self, key: str | None, request: Any, shape: Any, ttl_s: float) -> Any: ...


def _connection_state(ctx: Any) -> dict[str, Any] | None:
    """The connection's scratch state (persists across a 2025-11-25 session's requests)."""
    connection = connection_of(ctx)
    state = getattr(connection, "state", None)
    return state if isinstance(state, dict) else None


async def set_level(ctx: Any, params: types.SetLevelRequestParams) -> types.EmptyResult:
    """`logging/setLevel`: the lowest level of upstream log messages this connection is given."""
    state = _connection_state(ctx)
    if state is not None:
        state[_LEVEL_STATE] = params.level
    return types.EmptyResult()


def _wanted(ctx: Any) -> types.LoggingLevel | None:
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        asked = (ctx.meta or {}).get(LOG_LEVEL_META_KEY)
        return asked if asked in LEVELS else None
    state = _connection_state(ctx) or {}
    level = state.get(_LEVEL_STATE, DEFAULT_LEVEL)
    return level if level in LEVELS else DEFAULT_LEVEL


class ClientRelay:
    """One call's client (`ctx`, the tools/call request) as an upstream executor's `CallRelay`."""

    def __init__(self, ctx: Any, capability: Capability, redactor: Redactor) -> None:
        self._ctx: Any | None = ctx
        self._first = ctx
        self.rounds: Rounds | None = None
        """Set when the client is asked in input-required rounds (a 2026-07-28 client)."""
        self.rounds_ttl_s = 600.0
        self._capability = capability
        self._redactor = redactor
        self._level = _wanted(ctx)
        self.cancelled = anyio.Event()
        self._asked: list[dict[str, Any]] = []
        self._progress = 0
        self._logs = 0
        self._passing = 0
        self._passed = anyio.Event()

    def log_level(self) -> types.LoggingLevel | None:
        return self._level

    def declared(self) -> Declared:
        session = self._first.session
        return (session.check_client_capability(_ELICITATION), session.check_client_capability(_SAMPLING))

    def rebind(self, ctx: Any | None) -> None:
        """Pass what the upstream says on to this request of the client's (None: to no request, between
        input-required rounds: it is dropped then)."""
        self._ctx = ctx

    async def progress(self, progress: float, total: float | None, message: str | None) -> None:
        ctx = self._ctx
        if ctx is None:
            return
        self._progress += 1
        with self._passing_on():
            await ctx.session.report_progress(progress, total, message)

    async def log(self, params: types.LoggingMessageNotificationParams) -> None:
        ctx = self._ctx
        if ctx is None or self._level is None or LEVELS.index(params.level) < LEVELS.index(self._level):
            return
        self._logs += 1
        notification = types.LoggingMessageNotification(params=params)
        with self._passing_on():
            await ctx.session.send_notification(notification, related_request_id=ctx.request_id)

    @contextlib.contextmanager
    def _passing_on(self) -> Iterator[None]:
        self._passing += 1
        try:
            yield
        finally:
            self._passing -= 1
            if self._passing == 0:
                self._passed.set()
                self._passed = anyio.Event()

    async def passed_on(self) -> None:
        """Wait (a little at most) until what the upstream said so far has been passed on, so that the
        client hears it before the call's answer, as it would from the upstream itself."""
        with anyio.move_on_after(PASS_ON_WAIT_S):
            while self._passing:
                await self._passed.wait()

    async def elicit(
        self, params: types.ElicitRequestParams, key: str | None = None
    ) -> types.ElicitResult | types.ErrorData:
        asked: dict[str, Any] = {"kind": "elicitation", "message": params.message}
        if isinstance(params, types.ElicitRequestURLParams):
            asked.update(mode="url", url=params.url)
        else:
            asked.update(mode="form", requestedSchema=params.requested_schema)
        declared = types.ClientCapabilities(elicitation=types.ElicitationCapability())
        answer: types.ElicitResult | types.ErrorData = await self._ask(
            asked, declared, types.ElicitRequest(params=params), types.ElicitResult, key
        )
        if isinstance(answer, types.ElicitResult):
            asked["action"] = answer.action
            if answer.content is not None:
                asked["content"] = self._redactor.redact(self._capability, answer.content)
        return answer

    async def sample(
        self, params: types.CreateMessageRequestParams, key: str | None = None
    ) -> SamplingAnswer:
        asked: dict[str, Any] = {
            "kind": "sampling",
            "messages": [
                m.model_dump(mode="json", by_alias=True, exclude_none=True) for m in params.messages
            ],
            "maxTokens": params.max_tokens,
        }
        if params.system_prompt is not None:
            asked["systemPrompt"] = params.system_prompt
        declared = types.ClientCapabilities(sampling=types.SamplingCapability())
        shape: type[types.CreateMessageResult] | type[types.CreateMessageResultWithTools] = (
            types.CreateMessageResultWithTools if params.tools else types.CreateMessageResult
        )
        answer: SamplingAnswer = await self._ask(
            asked, declared, types.CreateMessageRequest(params=params), shape, key
        )
        if isinstance(answer, types.CreateMessageResult | types.CreateMessageResultWithTools):
            asked.update(model=answer.model, stopReason=answer.stop_reason)
        return answer

    async def _ask(
        self,
        asked: dict[str, Any],
        declared: types.ClientCapabilities,
        request: types.ElicitRequest | types.CreateMessageRequest,
        shape: Any,
        key: str | None = None,
    ) -> Any:
        """Send the upstream's request to the client (mid-call, or in an input-required round); a
        refusal or the client's error for the upstream."""
        self._asked.append(asked)
        ctx = self._first if self._ctx is None else self._ctx
        session = ctx.session
        kind = "elicitation" if isinstance(request, types.ElicitRequest) else "sampling"
        if not session.check_client_capability(declared):
            return self._refused(asked, NOT_DECLARED.format(kind))
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS or not session.can_send_request:
            if self.rounds is None:
                return self._refused(asked, NO_BACK_CHANNEL)
            asked["via"] = "input_required"
            answer = await self.rounds.ask(key, request, shape, self.rounds_ttl_s)
            if isinstance(answer, types.ErrorData):
                asked["refused"] = answer.message.removeprefix(REFUSED)
            return answer
        metadata = ServerMessageMetadata(related_request_id=ctx.request_id)
        try:
            return await session.send_request(request, shape, metadata=metadata)
        except MCPError as exc:
            asked["error"] = {"code": exc.code, "message": exc.message[:300]}
            return types.ErrorData(code=exc.code, message=exc.message, data=exc.data)
        except ValidationError:
            asked["error"] = {"code": types.INVALID_PARAMS, "message": "the client's answer is malformed"}
            return types.ErrorData(code=types.INVALID_PARAMS, message="the client's answer is malformed")
        except anyio.get_cancelled_exc_class():
            asked["cancelled"] = "by the upstream" if not self.cancelled.is_set() else "by the client"
            raise

    def _refused(self, asked: dict[str, Any], reason: str) -> types.ErrorData:
        asked["refused"] = reason
        return refusal(reason)

    def client_cancelled(self) -> None:
        """The client cancelled the call: the executor cancels its upstream request."""
        self._asked.append({"kind": "cancelled", "by": "client"})
        self.cancelled.set()

    def evidence(self) -> Mapping[str, Any]:
        shown: dict[str, Any] = {}
        if self._asked:
            shown["exchanges"] = list(self._asked)
        if self._progress:
            shown["progress"] = self._progress
        if self._logs:
            shown["logMessages"] = self._logs
        return shown
