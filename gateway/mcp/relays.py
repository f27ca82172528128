"""The MCP face for what upstream servers offer besides tools: resources, prompts, completions.

Listings are asked of the upstreams when a client asks and show only what policy could let the caller
read or get; nothing of a listing is recorded. A read (`resources/read`) or a get (`prompts/get`) is a
call through the one pipeline, as a tool call is: decided by policy, recorded (requested, then denied,
or dispatching and completed or failed), with the same privacy rules. Anything but its content answers
a JSON-RPC error whose `data` is the call's status document (`reason` for a denial).

What an upstream MCP server asks while serving a read or get (elicitation, sampling, in its
input-required rounds) reaches a 2026-07-28 client in input-required rounds of Writ's own, as during a
tool call (`parked.py`), and is recorded with the read or get (`midcall.py`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any, TypeVar

import mcp_types as types
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS

from capabilities.contract import BackendUnavailable, Capability
from capabilities.mcp_midcall import relaying
from capabilities.mcp_relays import prompt_of
from capabilities.registry import Registry
from capabilities.uris import uri_problem
from gateway.auth.standing import is_revoked
from gateway.calls.catalogue import Catalogue
from gateway.calls.pipeline import CallInput, CallPipeline, CallReport
from gateway.calls.rate_limits import RateLimited
from gateway.errors import UnknownTool
from gateway.mcp import rounds
from gateway.mcp.midcall import ClientRelay
from gateway.mcp.parked import Parked, reply
from gateway.mcp.results import pending_decision, status_document, writ_meta
from gateway.reasons import ReasonCode
from policy.model import Principal
from store.model import Unavailable
from store.ports import CallStatus

logger = logging.getLogger(__name__)

RESOURCE_NOT_FOUND = INVALID_PARAMS
"""The code of a read of a resource no upstream relays, with the URI as `data.uri` (SEP-2164)."""
REFUSED = -32003
"""Writ's code for a read or get it did not carry out: denied, waiting for approval, rate limited;
`data.status` and `data.reason` say which."""
INTERNAL = "Internal error in Writ (logged on the server)."
STORE_UNAVAILABLE = (
    "Writ's store is unavailable, so this request was not carried out: the upstream may have been asked, "
    "but its answer could not be recorded and is not given. Try again later."
)


def check_uri(registry: Registry, uri: str) -> None:
    """Refuse a URI an upstream could resolve to another than the one policy is asked about.

    Raises:
        MCPError: invalid params, with the URI as `data.uri` (as for an unknown one, SEP-2164).
    """
    capability = registry.resource_capability(uri)
    relay = registry.relay(capability) if capability is not None else None
    problem = uri_problem(uri, (relay.uri_prefix or "") if relay is not None else "")
    if problem is not None:
        raise MCPError(INVALID_PARAMS, f"Invalid resource URI, not read: {problem}: {uri}", {"uri": uri})


_Params = TypeVar("_Params")
_Result = TypeVar("_Result")
_Handler = Callable[["RelayFace", Any, _Params], Awaitable[_Result]]


def _guarded(handler: _Handler[_Params, _Result]) -> _Handler[_Params, _Result]:
    """The handler, with every error Writ did not mean answered as one that names no detail (the SDK
    would tell a 2025-11-25 client the exception's own text)."""

    @functools.wraps(handler)
    async def guarded(face: RelayFace, ctx: Any, params: _Params) -> _Result:
        try:
            return await handler(face, ctx, params)
        except MCPError:
            raise
        except Unavailable as exc:
            logger.error("%s: the store is unavailable: %s", handler.__name__, exc)
            raise MCPError(INTERNAL_ERROR, STORE_UNAVAILABLE) from exc
        except Exception as exc:
            logger.exception("%s failed", handler.__name__)
            raise MCPError(INTERNAL_ERROR, INTERNAL) from exc

    return guarded


class RelayFace:
    """Handlers of the relayed requests; `caller` is the MCP face's one authentication guard."""

    def __init__(
        self,
        pipeline: CallPipeline,
        catalogue: Catalogue,
        registry: Registry,
        store: CallStatus,
        caller: Callable[[], Principal],
    ) -> None:
        self.unknown: Callable[[Principal, str, str], None] = lambda who, kind, name: None
        """Notes an unknown resource or prompt as a `security.unknown_tool` of that kind (the MCP face
        sets its own)."""
        self.parked: Parked | None = None
        """Where a read or get whose upstream asks a 2026-07-28 client in rounds runs (None: refused)."""
        self.pipeline = pipeline
        self.catalogue = catalogue
        self.registry = registry
        self.store = store
        self.caller = caller

    @property
    def serves_resources(self) -> bool:
        return self.registry.relays_resources

    @property
    def serves_prompts(self) -> bool:
        return self.registry.relays_prompts

    # --- listings --------------------------------------------------------------------------------------

    @_guarded
    async def list_resources(
        self, ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        """resources/list: every relaying upstream's resources this caller may read."""
        who = await self._listing_caller()
        shown: list[types.Resource] = []
        if who is None:
            return types.ListResourcesResult(resources=shown)
        for capability, relay in self.registry.resource_relays():
            try:
                listed = await relay.list_resources()
            except BackendUnavailable as exc:
                logger.warning("resources/list: %s left out: %s", capability.backend, exc)
                continue
            shown.extend(r for r in listed if self.catalogue.may_list(who, capability, r.uri))
        return types.ListResourcesResult(resources=shown)

    @_guarded
    async def list_resource_templates(
        self, ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        """resources/templates/list: templates whose URI template a rule lets this caller read."""
        who = await self._listing_caller()
        shown: list[types.ResourceTemplate] = []
        if who is None:
            return types.ListResourceTemplatesResult(resource_templates=shown)
        for capability, relay in self.registry.resource_relays():
            try:
                listed = await relay.list_resource_templates()
            except BackendUnavailable as exc:
                logger.warning("resources/templates/list: %s left out: %s", capability.backend, exc)
                continue
            shown.extend(t for t in listed if self.catalogue.may_list(who, capability, t.uri_template))
        return types.ListResourceTemplatesResult(resource_templates=shown)

    @_guarded
    async def list_prompts(
        self, ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListPromptsResult:
        """prompts/list: the relayed prompts this caller may get."""
        who = await self._listing_caller()
        if who is None:
            return types.ListPromptsResult(prompts=[])
        visible = [c for c in self.registry.prompts() if self.catalogue.may_list(who, c)]
        return types.ListPromptsResult(prompts=[prompt_of(c) for c in visible])

    async def _listing_caller(self) -> Principal | None:
        """The caller, or None for a revoked one (who may read nothing, so is shown nothing)."""
        who = self.caller()
        try:
            revoked = await is_revoked(self.store, who)
        except Unavailable as exc:
            # As for tools/list: listed by policy alone; no read can be admitted without the store.
            logger.warning("listing: the store is unavailable, standing not checked: %s", exc)
            revoked = False
        return None if revoked else who

    # --- reads and gets -------------------------------------------------------------------------------

    @_guarded
    async def read_resource(
        self, ctx: Any, params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult | types.InputRequiredResult:
        """resources/read: a call decided by policy over the URI, read upstream and recorded (a read:
        one commit after it ran, or admitted first when a budget or loop rule counts it)."""
        check_uri(self.registry, params.uri)  # before policy sees it, the record holds it, or it is sent
        inp = CallInput(
            principal=self.caller(), tool_name=params.uri, arguments={"uri": params.uri}, kind="resource"
        )

        async def read(inp: CallInput) -> types.ReadResourceResult:
            report = await self._call(inp)
            content = _content(
                report, await pending_decision(self.store, report.reported), {"uri": params.uri}
            )
            return types.ReadResourceResult.model_validate(content)

        return await self._in_rounds(ctx, params, inp, self.registry.resource_capability(params.uri), read)

    @_guarded
    async def get_prompt(
        self, ctx: Any, params: types.GetPromptRequestParams
    ) -> types.GetPromptResult | types.InputRequiredResult:
        """prompts/get: a call decided by policy over the name and arguments, recorded, then got upstream."""
        inp = CallInput(
            principal=self.caller(),
            tool_name=params.name,
            arguments=dict(params.arguments or {}),
            kind="prompt",
        )

        async def get(inp: CallInput) -> types.GetPromptResult:
            report = await self._call(inp)
            content = _content(report, await pending_decision(self.store, report.reported))
            return types.GetPromptResult.model_validate(content)

        return await self._in_rounds(ctx, params, inp, self.registry.prompt(params.name), get)

    async def _in_rounds(
        self,
        ctx: Any,
        params: types.GetPromptRequestParams | types.ReadResourceRequestParams,
        inp: CallInput,
        capability: Capability | None,
        answer: Callable[[CallInput], Awaitable[_Result]],
    ) -> _Result | types.InputRequiredResult:
        """`answer(inp)`, or for a 2026-07-28 client of an upstream MCP server, the rounds of what the
        upstream asks meanwhile and then that answer (`parked.py`); a retry's `requestState` names them.

        Raises:
            MCPError: the retry names rounds no longer open here for this caller and name.
        """
        parked = self.parked
        if parked is None or not rounds.is_modern(ctx):
            return await answer(inp)
        if params.request_state is not None:
            try:
                exchange = parked.find(params.request_state, inp.principal, inp.tool_name)
            except LookupError as exc:
                raise MCPError(INVALID_PARAMS, str(exc)) from exc
            if exchange is not None:
                exchange.relay.rebind(ctx)
                exchange.answer(params.input_responses or {})
                return await reply(exchange)  # type: ignore[no-any-return]  # this request's own answer
        if capability is None or self.registry.relay(capability) is None:
            return await answer(inp)
        relay = ClientRelay(ctx, capability, self.pipeline.redactor)
        asked = replace(inp, asks_in_rounds=True)  # never joined with another caller's identical read

        async def run() -> _Result:
            with relaying(relay):
                return await answer(asked)

        exchange = parked.open(inp.principal, inp.tool_name, relay, run)
        if exchange is None:
            return await answer(inp)
        exchange.offer(params.input_responses or {})
        relay.rounds = exchange
        relay.rounds_ttl_s = parked.ttl_s
        return await reply(exchange)  # type: ignore[no-any-return]

    async def _call(self, inp: CallInput) -> CallReport:
        try:
            return await self.pipeline.call(inp)
        except UnknownTool as exc:
            self.unknown(inp.principal, f"unknown_{inp.kind}", inp.tool_name)
            if inp.kind == "resource":
                where = {"uri": inp.tool_name}
                raise MCPError(RESOURCE_NOT_FOUND, f"Resource not found: {inp.tool_name}", where) from exc
            raise MCPError(INVALID_PARAMS, f"Unknown prompt: {inp.tool_name!r}") from exc
        except RateLimited as exc:
            data = {
                "status": "denied",
                "reason": ReasonCode.RATE_LIMITED.value,
                "retryAfterS": exc.retry_after_s,
            }
            raise MCPError(
                REFUSED, f"Rate limited: nothing was done; try again in {exc.retry_after_s:g} s", data
            ) from exc

    # --- completions ----------------------------------------------------------------------------------

    @_guarded
    async def complete(self, ctx: Any, params: types.CompleteRequestParams) -> types.CompleteResult:
        """completion/complete: asked of the upstream that serves the prompt or template, when the
        caller may get or read it; not recorded (a suggestion reads nothing)."""
        who = self.caller()
        ref = params.ref
        capability: Capability | None
        if isinstance(ref, types.PromptReference):
            capability = self.registry.prompt(ref.name)
            visible = capability is not None and self.catalogue.may_list(who, capability)
            unknown = f"Unknown prompt: {ref.name!r}"
        else:
            capability = self.registry.resource_capability(ref.uri)
            visible = capability is not None and self.catalogue.may_list(who, capability, ref.uri)
            unknown = f"Unknown resource template: {ref.uri}"
        relay = self.registry.relay(capability) if capability is not None else None
        if capability is None or relay is None or not visible:
            kind, name = (
                ("unknown_prompt", ref.name)
                if isinstance(ref, types.PromptReference)
                else ("unknown_resource", ref.uri)
            )
            self.unknown(who, kind, name)
            raise MCPError(INVALID_PARAMS, unknown)
        if await is_revoked(self.store, who):
            raise MCPError(INVALID_PARAMS, unknown)
        try:
            return await relay.complete(capability, ref, params.argument, params.context)
        except BackendUnavailable as exc:
            logger.warning("completion/complete: %s", exc)
            raise MCPError(INTERNAL_ERROR, f"The upstream could not complete this: {exc}") from exc


def _content(
    report: CallReport, decision: Mapping[str, Any] | None, said: Mapping[str, Any] | None = None
) -> Mapping[str, Any]:
    """The relayed answer of a completed read or get, with Writ's `_meta`; `decision`, the policy
    decision recorded with a call waiting for approval, gives its rule's message (`pending_decision`).

    Raises:
        MCPError: the call was refused, is waiting, or failed: its status document (with `said`, a
            read's `uri`) is the error's data.
    """
    call = report.reported
    if call.status == "completed" and call.result is not None:
        # As for a tool result: Writ's ids in `_meta`, never the upstream's, which could claim to be
        # Writ's (`writ/status`, `writ/toolCallId`) or Writ itself (the `serverInfo` stamp).
        return {**(call.result.get("structuredContent") or {}), "_meta": writ_meta(call)}
    document = {**status_document(call, decision=decision), **(said or {})}
    if report.kind == "invalid_arguments":
        raise MCPError(INVALID_PARAMS, "Invalid arguments: " + "; ".join(report.validation_errors), document)
    if not report.recorded:
        raise MCPError(INTERNAL_ERROR, STORE_UNAVAILABLE, document)
    if call.status == "failed":
        code = _upstream_code(call.error)
        raise MCPError(code, f"Not read: {call.error or 'failed'} ({call.tool_call_id})", document)
    if call.status == "denied":
        raise MCPError(REFUSED, f"Denied ({call.reason}): {call.summary}", document)
    raise MCPError(REFUSED, f"Not carried out: the request is {call.status} ({call.tool_call_id})", document)


def _upstream_code(error: str | None) -> int:
    """The upstream's own JSON-RPC code when it refused (`mcp_error_32002`), else an internal error."""
    if error and error.startswith("mcp_error_") and error[10:].isdigit():
        return -int(error[10:])
    return INTERNAL_ERROR
