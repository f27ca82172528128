"""The MCP face: a low-level `mcp.server.Server` whose tools come from the registry, filtered per caller.

Every tools/call goes through the one pipeline; this module only translates between MCP and it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, TypeGuard

import anyio.to_thread
import mcp_types as types
from mcp.server import Server
from mcp.server.lowlevel.server import NotificationOptions
from mcp.server.models import InitializationOptions
from mcp.server.request_state import RequestStateSecurity
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, MISSING_REQUIRED_CLIENT_CAPABILITY

from capabilities.contract import Capability
from capabilities.mcp_midcall import relaying
from capabilities.registry import Registry
from gateway.audit.security import NoSecurityEvents, SecurityRefusal, SecuritySink, shown
from gateway.auth.oversight import may_read
from gateway.auth.standing import is_revoked, revoked_text
from gateway.calls.catalogue import Catalogue
from gateway.calls.pipeline import CallInput, CallPipeline, ConfirmInput
from gateway.calls.rate_limits import RateLimited
from gateway.clock import Clock
from gateway.errors import Refused, UnknownTool
from gateway.mcp import rounds, tracing
from gateway.mcp.changes import Notices
from gateway.mcp.documents import StatusDocument, output_schema
from gateway.mcp.midcall import ClientRelay, set_level
from gateway.mcp.parked import Exchange, Parked, reply
from gateway.mcp.relays import RelayFace
from gateway.mcp.results import (
    missing_capability,
    pending_decision,
    rate_limited,
    recorded_detail,
    shape_call,
    shape_report,
    status_document,
)
from gateway.mcp.subscriptions import Subscriptions
from gateway.reasons import ReasonCode
from gateway.telemetry import Telemetry
from store.commands import DecideApproval
from store.limits import CLIENT_ID_CHARS
from store.model import CallView, NotFound, StaleLease, Unavailable
from store.ports import CallStatus

logger = logging.getLogger(__name__)

STATUS_TOOL = "writ_call_status"
META_KEY = "writ/idempotencyKey"
META_RUN = "writ/runId"
STORE_UNAVAILABLE = (
    "Writ's store is unavailable, so this call was not carried out: nothing with an effect was sent to "
    "the backend (a read may have been, but its answer could not be recorded and is not given). Retry "
    "later with the same writ/idempotencyKey: it cannot cause a second effect. If the call was "
    "recorded after all, the retry reports that call's state instead: it was never sent, and once Writ "
    "has settled it as failed, a new key carries the effect."
)
WITHDRAWN = "withdrawn by the requester (tasks/cancel)"
NOT_CANCELLED = "Writ's store is unavailable, so the task was not cancelled. Try again later."
STATUS_UNAVAILABLE = "Writ's store is unavailable, so the call's state cannot be read now. Ask again later."
INTERNAL = "Internal error in Writ (logged on the server)."
MAX_ID = CLIENT_ID_CHARS

PrincipalProvider = Callable[[], Any]
"""Returns the current caller's `Principal`, or None when the request is unauthenticated."""

_STATUS_TOOL = types.Tool(
    name=STATUS_TOOL,
    title="Writ call status",
    description=(
        "Current state of a tool call made through Writ (approval_pending, dispatching, result_unknown, "
        "completed, failed, denied, ...) and, once completed, its result. Use the toolCallId that Writ "
        "returned. Calling this never repeats the call."
    ),
    input_schema={
        "type": "object",
        "properties": {"toolCallId": {"type": "string", "description": "The toolCallId Writ returned."}},
        "required": ["toolCallId"],
        "additionalProperties": False,
    },
    output_schema=output_schema(),
    annotations=types.ToolAnnotations(read_only_hint=True, idempotent_hint=True),
)


def _tool(capability: Capability) -> types.Tool:
    return types.Tool(
        name=capability.tool_name,
        title=capability.title,
        description=capability.description or None,
        input_schema=dict(capability.input_schema),
        annotations=types.ToolAnnotations(
            read_only_hint=capability.effect == "read",
            destructive_hint=capability.effect == "irreversible",
            idempotent_hint=capability.effect == "read",
        ),
        meta={"writ/capability": capability.ref, "writ/effect": capability.effect},
    )


class McpFace:
    """The MCP face's handlers, one method per request, each readable alone.

    `caller` is the one authentication guard (the HTTP edge already refused a request without a
    token; stdio always has a principal); a principal's standing is asked of the store per request,
    and each handler answers a revoked principal in its own request's terms.
    """

    def __init__(
        self,
        pipeline: CallPipeline,
        catalogue: Catalogue,
        store: CallStatus,
        principal: PrincipalProvider,
        telemetry: Telemetry,
        clock: Clock,
        security: SecuritySink | None = None,
        registry: Registry | None = None,
        process_session: str | None = None,
        parked: Parked | None = None,
    ) -> None:
        self.parked = parked
        """Where calls that ask a 2026-07-28 client in input-required rounds run (None: it is refused)."""
        self.security = security or NoSecurityEvents()
        self.registry = registry
        self.process_session = process_session
        """The session of a `writ stdio` process: one client, one session, for as long as it runs."""
        self.pipeline = pipeline
        self.catalogue = catalogue
        self.clock = clock
        self.store = store
        self.principal = principal
        self.telemetry = telemetry

    def caller(self) -> Any:
        """The current principal.

        Raises:
            MCPError: the request is unauthenticated.
        """
        current = self.principal()
        if current is None:  # the HTTP edge refuses these before they get here; stdio always has one
            raise MCPError(INVALID_PARAMS, "Unauthenticated request")
        return current

    def input_schema(self, tool: str) -> dict[str, Any] | None:
        """The input schema the SDK validates a tool's arguments against, None for an unknown tool."""
        if tool == STATUS_TOOL:
            return _STATUS_TOOL.input_schema
        capability = self.catalogue.capability(tool)
        return dict(capability.input_schema) if capability else None

    async def list_tools(
        self, ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        """tools/list: the tools this caller may call, and `writ_call_status`."""
        who = self.caller()
        try:
            revoked = await is_revoked(self.store, who)
        except Unavailable as exc:
            # Listed by policy alone: no call can be admitted without the store, and a client that
            # validates a call's answer lists the tools first (the SDK does), so refusing the list
            # would lose the answer it is waiting for, `result_unknown` included.
            logger.warning("tools/list: the store is unavailable, standing not checked: %s", exc)
            revoked = False
        if revoked:  # a revoked principal may call nothing, so nothing is listed to it
            return types.ListToolsResult(tools=[])
        visible = self.catalogue.visible(who)
        return types.ListToolsResult(tools=[*map(_tool, visible), _STATUS_TOOL])

    async def call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> Any:
        """tools/call, with every error Writ did not mean translated to one that names no detail."""
        try:
            return await self._call_tool(ctx, params)
        except Unavailable as exc:
            # Raised before anything with an effect was sent: once such a call is dispatched, a store
            # that goes away makes its answer `result_unknown` instead (gateway.calls.dispatch). A read
            # allowed outright may have run: its answer, never recorded, is not told either.
            logger.error("tools/call %s: the store is unavailable: %s", params.name, exc)
            message = STATUS_UNAVAILABLE if params.name == STATUS_TOOL else STORE_UNAVAILABLE
            raise MCPError(INTERNAL_ERROR, message) from exc
        except MCPError:
            raise
        except Exception as exc:
            # The SDK answers a 2025-11-25 session with the exception's own text (code 0): say no more
            # than that something failed, and keep the detail in the server's log.
            logger.exception("tools/call %r failed", params.name)
            raise MCPError(INTERNAL_ERROR, INTERNAL) from exc

    async def _call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> Any:
        who = self.caller()
        if params.name == STATUS_TOOL:
            return await self._call_status(who, params.arguments or {})
        if params.request_state is not None:
            exchange = self._exchange(who, params)
            if exchange is not None:
                exchange.relay.rebind(ctx)
                exchange.answer(params.input_responses or {})
                return await self._rounds(exchange)
            return await self._confirmation_answer(who, params)
        meta = params.meta or {}
        key, run = _meta_identifier(meta, META_KEY), _meta_identifier(meta, META_RUN)
        call = CallInput(
            principal=who,
            tool_name=params.name,
            arguments=params.arguments or {},
            idempotency_key=key,
            run_id=run,
            session_id=self.session_of(ctx),
            can_confirm=rounds.can_confirm(ctx),
        )
        relay = self._relay(ctx, params.name)
        if relay is not None and rounds.is_modern(ctx) and self.parked is not None:
            call = replace(call, asks_in_rounds=True)
            # A 2026-07-28 client is asked what the upstream asks in input-required rounds: the call
            # runs on in this process's task group while the client answers (`parked`).
            parked = relay
            exchange = self.parked.open(
                who, params.name, relay, lambda: self._answer(ctx, params, call, parked)
            )
            if exchange is not None:
                exchange.offer(params.input_responses or {})
                relay.rounds = exchange
                relay.rounds_ttl_s = self.parked.ttl_s
                return await self._rounds(exchange)
        return await self._answer(ctx, params, call, relay)

    async def _answer(
        self, ctx: Any, params: types.CallToolRequestParams, call: CallInput, relay: ClientRelay | None
    ) -> Any:
        """The call decided, run and recorded, and what its client is answered."""
        who = call.principal
        with self.telemetry.tool_call(params.name, params.arguments or {}) as traced:
            try:
                if relay is None:
                    report = await self.pipeline.call(call)
                elif relay.rounds is not None:  # already in a task of its own, which a client never cancels
                    with relaying(relay):
                        report = await self.pipeline.call(call)
                else:
                    report = await self._relayed(relay, call)
            except UnknownTool as exc:
                traced.unknown_tool()
                self.unknown(who, "unknown_tool", params.name)
                raise MCPError(INVALID_PARAMS, str(exc)) from exc
            except RateLimited as exc:
                traced.rate_limited()
                self.security.note(
                    SecurityRefusal(
                        "security.edge_refused", "rate_limited", tenant=who.tenant, subject=who.subject
                    )
                )
                return types.CallToolResult.model_validate(rate_limited(params.name, exc.retry_after_s))
            traced.record(report)
        if report.call.status == "awaiting_confirmation":
            return rounds.ask_to_confirm(report.call, report.capability.ref)
        if report.call.status == "approval_pending" and rounds.wants_tasks(ctx):
            return {"resultType": "task", **(await self._task(report.call))}
        if (missing := missing_capability(report)) is not None:
            raise MCPError(MISSING_REQUIRED_CLIENT_CAPABILITY, *missing)
        decision = await self._decision(report.reported)
        detail = await recorded_detail(self.store, report.reported)
        # Handed on as JSON: the SDK validates a handler's result against the protocol's surface and
        # dumps it once itself, so a model built here would be validated and dumped twice. The
        # `resultType` is what the model would add (a legacy surface drops it).
        return {"resultType": "complete", **shape_report(report, decision, detail)}

    def _exchange(self, who: Any, params: types.CallToolRequestParams) -> Exchange | None:
        """The open call a retry's `requestState` names, if it is a relayed round's.

        Raises:
            MCPError: it is one, but no longer open here for this caller and tool.
        """
        if self.parked is None:
            return None
        try:
            return self.parked.find(params.request_state or "", who, params.name)
        except LookupError as exc:
            raise MCPError(INVALID_PARAMS, str(exc)) from exc

    async def _rounds(self, exchange: Exchange) -> Any:
        """The next round of what the upstream asks, or the call's answer once it ended (`reply`)."""
        return await reply(exchange)

    def _relay(self, ctx: Any, tool_name: str) -> ClientRelay | None:
        """The client side of a call to an upstream MCP tool (None for any other tool)."""
        capability = self.catalogue.capability(tool_name)
        if capability is None or self.registry is None:
            return None
        if self.registry.relay(capability) is None:
            return None
        return ClientRelay(ctx, capability, self.pipeline.redactor)

    async def _relayed(self, relay: ClientRelay, call: CallInput) -> Any:
        """The call run to its recorded end even when the client cancels it: the cancel goes to the
        executor (which cancels the upstream request), and the outcome is recorded before this request
        ends unanswered, as a cancelled request does."""
        done: list[Any] = []
        async with anyio.create_task_group() as group:

            async def watch() -> None:
                try:
                    await anyio.sleep_forever()
                except anyio.get_cancelled_exc_class():
                    relay.client_cancelled()
                    raise

            group.start_soon(watch)
            with anyio.CancelScope(shield=True), relaying(relay):
                try:
                    done.append(await self.pipeline.call(call))
                except Exception as exc:  # raised below, outside the task group
                    done.append(exc)
            group.cancel_scope.cancel()
        if isinstance(done[0], Exception):
            raise done[0]
        return done[0]

    def session_of(self, ctx: Any) -> str | None:
        """The MCP session a request came in: the stdio process's, or a 2025-11-25 HTTP session's
        `mcp-session-id` (the SDK answered 404 to one it does not hold for this caller); None for
        2026-07-28, which has no sessions."""
        if self.process_session is not None:
            return self.process_session
        if rounds.is_modern(ctx):
            return None
        request = getattr(ctx, "request", None)
        headers = getattr(request, "headers", None)
        session = headers.get(MCP_SESSION_ID_HEADER) if headers is not None else None
        return session if isinstance(session, str) and 0 < len(session) <= MAX_ID else None

    async def _confirmation_answer(self, who: Any, params: types.CallToolRequestParams) -> Any:
        """The client's retry of a confirmation round: the user's answer, consumed at most once."""
        bound = rounds.read_state(params.request_state or "")
        if bound is None:
            raise MCPError(INVALID_PARAMS, "Invalid or expired requestState")
        tool_call_id, confirmation_id, _ = bound
        action = rounds.answer_of(params.input_responses)
        if action is None:  # no answer yet: ask again while the call still waits
            return await self._ask_again(who, params.name, tool_call_id)
        try:
            report = await self.pipeline.confirm(
                ConfirmInput(
                    principal=who,
                    tool_name=params.name,
                    arguments=params.arguments or {},
                    tool_call_id=tool_call_id,
                    confirmation_id=confirmation_id,
                    action=action,
                )
            )
        except UnknownTool as exc:
            # A sealed round answered under another tool's name (or one gone since): noted like a call.
            self.unknown(who, "unknown_tool", params.name)
            raise MCPError(INVALID_PARAMS, str(exc)) from exc
        except Refused as exc:
            logger.warning("confirmation answer for %s refused: %s", tool_call_id, exc)
            return rounds.refusal(exc.code, str(exc), tool_call_id)
        return types.CallToolResult.model_validate(shape_report(report))

    async def _ask_again(self, who: Any, tool_name: str, tool_call_id: str) -> Any:
        call = await anyio.to_thread.run_sync(lambda: self.store.get_call(tool_call_id, tenant=who.tenant))
        capability = self.catalogue.capability(tool_name)
        if call is not None and capability is not None and call.status == "awaiting_confirmation":
            return rounds.ask_to_confirm(call, capability.ref)
        return rounds.refusal(
            ReasonCode.CONFIRMATION_USED, "the call no longer awaits a confirmation", tool_call_id
        )

    def unknown(self, who: Any, kind: str, name: str) -> None:
        """Note a `security.unknown_tool` of `kind` (`unknown_tool`, `unknown_resource`, `unknown_prompt`):
        an authenticated caller asked for something that does not exist or is not visible to it."""
        self.security.note(
            SecurityRefusal(
                "security.unknown_tool", kind, tenant=who.tenant, subject=who.subject, tool_name=shown(name)
            )
        )

    async def _call_status(self, who: Any, arguments: dict[str, Any]) -> types.CallToolResult:
        """`writ_call_status`: the call's state and, once completed, its result."""
        if await is_revoked(self.store, who):
            refused = StatusDocument(status="denied", reason=ReasonCode.PRINCIPAL_REVOKED)
            return _status_error(f"Refused: {revoked_text(who)}.", refused)
        tool_call_id = arguments.get("toolCallId")
        if not isinstance(tool_call_id, str) or not tool_call_id:
            return _status_error("writ_call_status needs a toolCallId (string).")
        call = await self._own_call(who, tool_call_id)
        if call is None:
            text = f"No tool call {_shown(tool_call_id, 'toolCallId')} is known to Writ."
            if _is_identifier(tool_call_id):
                return _status_error(text, StatusDocument(status="not_found", tool_call_id=tool_call_id))
            return _status_error(text, StatusDocument(status="not_found"))
        decision = await self._decision(call)
        detail = await recorded_detail(self.store, call)
        shaped = shape_call(call, self.catalogue.capability(call.tool_name), decision, detail)
        status = status_document(call, include_result=True, decision=decision, detail=detail)
        shaped["structuredContent"] = status
        if call.status != "completed":
            shaped["content"] = [{"type": "text", "text": _status_text(status)}]
        return types.CallToolResult.model_validate(shaped)

    async def _decision(self, call: CallView) -> Mapping[str, Any] | None:
        return await pending_decision(self.store, call)

    async def _own_call(self, who: Any, call_id: object) -> CallView | None:
        """The call with this id if the caller may read it (their own, or their tenant's as an
        overseer), else None, exactly as for an unknown id (one no call can have is not looked up)."""
        if not _is_identifier(call_id):
            return None
        call = await anyio.to_thread.run_sync(lambda: self.store.get_call(call_id, tenant=who.tenant))
        return call if call is not None and may_read(who, call.subject) else None

    async def tasks_get(self, ctx: Any, params: rounds.TaskParams) -> dict[str, Any]:
        """tasks/get: the task of a pending call, final once the call is."""
        call = await self._task_call(ctx, params)
        try:
            task = await self._task(call)
        except Unavailable as exc:
            logger.error("tasks/get: the store is unavailable: %s", exc)
            raise MCPError(INTERNAL_ERROR, STATUS_UNAVAILABLE) from exc
        return {"resultType": "complete", **task}

    async def tasks_update(self, ctx: Any, params: rounds.TaskParams) -> dict[str, Any]:
        """tasks/update: Writ's tasks never ask for input, so there is nothing to update."""
        await self._task_call(ctx, params)
        return {"resultType": "complete"}

    async def tasks_cancel(self, ctx: Any, params: rounds.TaskParams) -> dict[str, Any]:
        """The requester withdraws a call still waiting for an approver: it is rejected, by them.

        Cancellation is cooperative (SEP-2663): a call already approved, sent or settled is not undone,
        and only its requester withdraws it (an approver rejects it in the console instead); either way
        the request is acknowledged, and `tasks/get` tells what became of the task.
        """
        who, call = self.caller(), await self._task_call(ctx, params)
        if call.status == "approval_pending" and call.approval_id is not None and call.subject == who.subject:
            await self._withdraw(who, call.approval_id)
        return {"resultType": "complete"}

    async def _withdraw(self, who: Any, approval_id: str) -> None:
        try:
            await anyio.to_thread.run_sync(
                lambda: self.store.decide_approval(
                    DecideApproval(
                        approval_id,
                        approve=False,
                        decided_by=who.subject,
                        reason=WITHDRAWN,
                        now=self.clock(),
                        tenant=who.tenant,
                        decided_by_roles=who.roles,
                    )
                )
            )
        except (StaleLease, NotFound):
            pass  # decided or expired meanwhile: nothing left to withdraw
        except Unavailable as exc:
            logger.error("tasks/cancel: the store is unavailable: %s", exc)
            raise MCPError(
                INTERNAL_ERROR, "Writ's store is unavailable: the task was not cancelled."
            ) from exc

    async def _task_call(self, ctx: Any, params: rounds.TaskParams) -> CallView:
        """The call a tasks/* request names, for a caller in good standing who may read it.

        Raises:
            MCPError: tasks are not negotiated, the caller is revoked, or no such call is theirs.
        """
        rounds.require_tasks(ctx)
        who = self.caller()
        try:
            if await is_revoked(self.store, who):
                raise MCPError(INVALID_REQUEST, f"Refused: {revoked_text(who)}.")
            call = await self._own_call(who, params.task_id)
        except Unavailable as exc:
            logger.error("tasks: the store is unavailable: %s", exc)
            raise MCPError(INTERNAL_ERROR, STATUS_UNAVAILABLE) from exc
        if call is None:
            raise MCPError(INVALID_PARAMS, f"No task {_shown(params.task_id, 'taskId')} is known to Writ.")
        return call

    async def _task(self, call: CallView) -> dict[str, Any]:
        decision = await self._decision(call)
        final = shape_call(call, self.catalogue.capability(call.tool_name), decision)
        status = status_document(call, decision=decision)
        return rounds.task_of(call, final, _status_text(status), withdrawn=await self._withdrawn(call))

    async def _withdrawn(self, call: CallView) -> bool:
        """Whether the call's approval was rejected by its own requester: the task was cancelled."""
        if call.status != "rejected" or call.approval_id is None:
            return False
        approval_id = call.approval_id
        approval = await anyio.to_thread.run_sync(
            lambda: self.store.get_approval(approval_id, tenant=call.tenant)
        )
        return approval is not None and approval.decided_by == approval.requester


def build_mcp_server(
    pipeline: CallPipeline,
    catalogue: Catalogue,
    store: CallStatus,
    principal: PrincipalProvider,
    *,
    clock: Clock,
    telemetry: Telemetry | None = None,
    sealing: RequestStateSecurity | None = None,
    confirmation_ttl_s: float = 600.0,
    name: str = "writ",
    registry: Registry | None = None,
    security: SecuritySink | None = None,
    transport: str | None = None,
    process_session: str | None = None,
    parked: Parked | None = None,
) -> Server[Any]:
    """The low-level MCP server for this gateway: `pipeline` decides and runs calls, `catalogue` says
    what a caller is shown; `sealing` protects confirmation rounds' state (by default this process's
    own keys, for rounds of `confirmation_ttl_s`).

    With a `registry` whose upstreams relay resources or prompts, it serves (and advertises) those
    and completions too; else a client hears that they are not there, as from a server without them.
    `transport` is `network.transport` in spans of requests that do not come over HTTP (`pipe`).
    With `parked` (served by the runtime's workers), an upstream's elicitation and sampling reach a
    2026-07-28 client in input-required rounds; without it they are refused to the upstream.
    """
    face = McpFace(
        pipeline,
        catalogue,
        store,
        principal,
        telemetry or Telemetry(),
        clock,
        security,
        registry,
        process_session=process_session,
        parked=parked,
    )
    relays = RelayFace(pipeline, catalogue, registry, store, face.caller) if registry is not None else None
    if relays is not None:
        relays.unknown = face.unknown  # unknown resources and prompts, noted as security events
        relays.parked = parked  # what an upstream asks during a read or get: rounds, as for a call
    resources = relays if relays is not None and relays.serves_resources else None
    prompts = relays if relays is not None and relays.serves_prompts else None
    completing = resources or prompts
    upstreams = registry is not None and bool(registry.upstreams())
    notices = Notices() if upstreams else None
    watching = (
        Subscriptions(registry, catalogue, store, face.caller, clock, notices)
        if registry is not None and notices is not None and resources is not None
        else None
    )
    listen = watching.listen if watching is not None else notices.listen if notices is not None else None
    server: Server[Any] = _Server(
        NotificationOptions(tools_changed=True, resources_changed=True, prompts_changed=True)
        if notices is not None
        else NotificationOptions(),
        name,
        version=_version(),
        instructions=(
            "Writ guards these tools. A call may return a state instead of a result: approval_pending "
            "(wait; a human decides), result_unknown (do not retry; Writ reconciles), denied (do not retry "
            "unchanged). Use writ_call_status with the toolCallId to follow a call."
        ),
        on_list_tools=face.list_tools,
        on_call_tool=face.call_tool,
        get_tool_input_schema=face.input_schema,
        on_list_resources=resources.list_resources if resources else None,
        on_list_resource_templates=resources.list_resource_templates if resources else None,
        on_read_resource=resources.read_resource if resources else None,
        on_list_prompts=prompts.list_prompts if prompts else None,
        on_get_prompt=prompts.get_prompt if prompts else None,
        on_completion=completing.complete if completing else None,
        on_subscribe_resource=watching.subscribe if watching is not None else None,
        on_unsubscribe_resource=watching.unsubscribe if watching is not None else None,
        on_subscriptions_listen=listen,
    )
    tracing.instrument(server, face.telemetry, transport)
    sealing = sealing or rounds.sealing(confirmation_ttl_s)
    server.middleware.append(rounds.request_state_boundary(sealing, name))
    server.extensions[rounds.TASKS_EXTENSION] = {}
    if registry is not None and notices is not None:
        # Upstream log messages are relayed at the level each client asks for.
        server.add_request_handler("logging/setLevel", types.SetLevelRequestParams, set_level)
        # An upstream's changed listings, once the registry took them, are announced to the clients.
        server.middleware.append(notices.track)
        registry.on_change(notices.listing_changed)
    server.add_request_handler("tasks/get", rounds.TaskParams, face.tasks_get)
    server.add_request_handler("tasks/update", rounds.TaskParams, face.tasks_update)
    server.add_request_handler("tasks/cancel", rounds.TaskParams, face.tasks_cancel)
    return server


class _Server(Server[Any]):
    """The SDK's server, announcing on 2025-11-25 the list changes Writ sends (on 2026-07-28 the
    SDK derives them from `subscriptions/listen` being served)."""

    def __init__(self, changes: NotificationOptions, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._changes = changes

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        return super().create_initialization_options(
            notification_options or self._changes, experimental_capabilities, extensions
        )


def _status_error(text: str, document: StatusDocument | None = None) -> types.CallToolResult:
    """A `writ_call_status` answer that reports no call: an error result, with a document if any."""
    body: dict[str, Any] = {"content": [{"type": "text", "text": text}]}
    if document is not None:
        body["structuredContent"] = document.dump()
    return types.CallToolResult.model_validate({**body, "isError": True})


def _meta_identifier(meta: Mapping[str, Any], name: str) -> str | None:
    """`_meta[name]` if given. Keys travel in backends' HTTP headers and both are looked up in the
    store, so both are plain printable ASCII: a control character, a lone surrogate or non-ASCII text
    could be recorded (or not: PostgreSQL refuses NUL) and then never be sent.

    Raises:
        MCPError: it is given and is not such a string.
    """
    value = meta.get(name)
    if value is None or _is_identifier(value):
        return value
    raise MCPError(
        INVALID_PARAMS,
        f"_meta[{name!r}] must be a string of 1 to {MAX_ID} printable ASCII characters "
        "(no control characters, no surrounding spaces)",
    )


def _is_identifier(value: object) -> TypeGuard[str]:
    """A client-chosen key or id Writ will store and send: 1 to 255 printable ASCII characters, no
    surrounding spaces (a header value's surrounding whitespace is not part of it, RFC 9110 §5.5)."""
    return (
        isinstance(value, str)
        and 0 < len(value) <= MAX_ID
        and value.isascii()
        and value.isprintable()
        and value == value.strip()
    )


def _shown(call_id: object, name: str) -> str:
    """An id as an answer may quote it: only one that could be an id (never 1 MB of anything)."""
    return repr(call_id) if _is_identifier(call_id) else f"with this {name}"


def _status_text(status: dict[str, Any]) -> str:
    parts = [f"Call {status['toolCallId']} is {status['status']}."]
    if effect := status.get("effect"):
        parts.append(f"Effect: {effect['summary']} ({effect['capability']}).")
    if message := status.get("message"):
        parts.append(f"The policy says: {message.rstrip()}")
    if status.get("next"):
        parts.append(status["next"])
    return " ".join(parts)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("writ-gateway")
    except PackageNotFoundError:
        return "0.0.0"
