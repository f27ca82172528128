"""Executor for an upstream MCP server, over streamable HTTP (`url:`) or stdio (`command:`).

One persistent client session per backend (see `mcp_session`) serves all calls concurrently; a
dead session is reopened on the next call. The SDK's client states the capabilities of the callbacks
it was made with (in its handshake, and on every 2026-07-28 request), so over HTTP a call whose
client lacks elicitation or sampling goes on a session of its own made without them (at most three
more, opened lazily, for calls only: listings and subscriptions stay on the first), and the upstream
hears what the calling client can be asked. Not over stdio: another session there is another
process of the upstream, whose state (what a call changed, its list changes) the others never see;
a stdio upstream hears Writ's own capabilities, and Writ refuses what a client cannot be asked.
Over MCP "sent" cannot be told from "answered late" as
finely as over plain HTTP, so anything after the request may have left counts as `unknown`.

An answer is read no further than the backend's `max_response_bytes`: over HTTP a JSON body (through
`bounded_http`) or an SSE event (the SDK's own limit), over stdio a line (`bounded_stdio`). A longer
one is `response_too_large`.
"""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPDeprecationWarning
from mcp_types import LOG_LEVEL_META_KEY
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from capabilities.bounded_http import LIMIT_SETTING, bounded_responses
from capabilities.bounded_stdio import bounded_stdio_client
from capabilities.config import McpBackend
from capabilities.contract import (
    BackendUnavailable,
    Capability,
    CapabilityError,
    Invocation,
    Outcome,
    ReconcileResult,
    ToolResult,
)
from capabilities.credentials import Credentials
from capabilities.mcp_changes import Announcements, Watched
from capabilities.mcp_midcall import (
    ALL_DECLARED,
    CallRelay,
    ClientCancelled,
    Declared,
    MidCall,
    current_relay,
    is_refusal,
    until_cancelled,
)
from capabilities.mcp_reconcile import MissingField, lookup_arguments, verdict
from capabilities.mcp_relays import (
    all_pages,
    prefixed_contents,
    prefixed_messages,
    prompt_capabilities,
    resource_capability,
    shown_uri,
    upstream_uri,
)
from capabilities.mcp_session import Session, SessionKeeper
from capabilities.mcp_tools import capabilities_from_tools, reconcile_setting, tool_errors_setting
from capabilities.oauth_tokens import TokenSource
from capabilities.results import failed_outcome, is_json, unanswered_outcome

_DETAIL_CHARS = 300
logger = logging.getLogger(__name__)

# The MCP SDK's HTTP transport turns what it could not use of an upstream's answer into a JSON-RPC error
# with a code (-32700, -32600) that an upstream also sends when it refused a request: no exception type,
# code or `data` tells the two apart, only the message. Refused is `failed`; an unusable answer to a
# request that reached the upstream is `unknown`. tests/capabilities/test_mcp_sdk_errors.py fails if
# the SDK rewords any of these, before an upgrade can turn `unknown` into `failed`.

ANSWERED_UNUSABLY = (
    "Failed to parse JSON response",
    "Failed to parse SSE message",
    "Unexpected content type",
    "server answered a request with 202 Accepted",
    "Redirect to ",
)
"""How the SDK's HTTP transport words the errors it makes up when the upstream received the request and
answered with something that is not a JSON-RPC response (not JSON, another content type, 202 Accepted,
a redirect it did not follow). Their codes (-32700, -32600) also mean "the server refused the request",
but here the upstream may have acted."""

SESSION_TERMINATED = "Session terminated"
"""How the SDK's HTTP transport words a 404 to a request in a session: the session is opened afresh."""

TOO_LARGE_SSE = "SSE stream failed: Server-sent event exceeded the "
"""How the SDK words an SSE event over its `max_sse_event_size` (set to `max_response_bytes`). A JSON
body over the limit is recognised by Writ's own `ResponseTooLarge` text in the parse error; over stdio,
`bounded_stdio` answers the request itself, with `stdio_framing.too_large_message`."""


class McpExecutor:
    """Calls the tools of one upstream MCP server; one instance per backend, shared by all calls."""

    def __init__(
        self,
        name: str,
        config: McpBackend,
        credentials: Credentials | None = None,
        *,
        child_env: Mapping[str, str] | None = None,
        base_dir: Path | None = None,
    ) -> None:
        self.name = name
        self._config = config
        self._credentials = credentials or Credentials.none()
        self._child_env = {**config.env, **(child_env or {})}
        self._base_dir = base_dir
        self.announcements = Announcements(name)
        """List changes and resource updates the upstream announces, for whoever listens."""
        self._sessions = SessionKeeper(
            name,
            self._client,
            open_timeout_s=config.timeout_s,
            describe=self._describe,
            watch=self._opened,
        )
        self._upstream: dict[str, str] = {}
        """capability id -> upstream tool name, filled by discover()."""
        self._midcall = MidCall(name)
        self._variants: dict[Declared, tuple[SessionKeeper, MidCall]] = {}
        """Sessions stating less than all of (elicitation, sampling), for calls whose clients do."""
        self._watched = Watched(name, self.announcements)

    # --- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the session.

        Raises:
            BackendUnavailable: the upstream cannot be reached or does not complete the handshake.
        """
        try:
            await self._sessions.start()
        except BackendUnavailable:
            await self._sessions.close()
            raise

    async def close(self) -> None:
        await self._sessions.close()
        variants = list(self._variants.values())
        self._variants.clear()
        for keeper, _ in variants:
            await keeper.close()

    async def _session_for(self, relay: CallRelay | None) -> tuple[Session, MidCall]:
        """The session stating the capabilities `relay`'s client declared (all of them without a
        client: its requests are refused as today), and the callbacks routing that session's talk.

        Raises:
            BackendUnavailable: not started, or the upstream cannot be reached.
        """
        first = await self._sessions.current()
        declared = ALL_DECLARED if relay is None else relay.declared()
        if declared == ALL_DECLARED or self._config.url is None:  # stdio: one process (see above)
            return first, self._midcall
        variant = self._variants.get(declared)
        if variant is None:
            midcall = MidCall(self.name)
            keeper = SessionKeeper(
                self.name,
                lambda stack, ended: self._client(stack, ended, declared, midcall),
                open_timeout_s=self._config.timeout_s,
                describe=self._describe,
            )
            variant = self._variants[declared] = (keeper, midcall)
            return await keeper.start(), midcall
        keeper, midcall = variant
        return await keeper.current(), midcall

    async def discover(self) -> Sequence[Capability]:
        """The upstream's tools as capabilities, after `tools:`, `rename:`, `defaults:` and `overrides:`.

        Raises:
            BackendUnavailable: the listing failed.
            ConfigError: the config names tools the upstream does not have.
        """
        client = (await self._sessions.current()).client
        assert client is not None
        tools: list[mcp_types.Tool] = []
        cursor: str | None = None
        try:
            with anyio.fail_after(self._config.timeout_s):
                while True:
                    page = await client.list_tools(cursor=cursor)
                    tools.extend(page.tools)
                    cursor = page.next_cursor
                    if not cursor:
                        break
        except (MCPError, TimeoutError, ValidationError) as exc:
            raise BackendUnavailable(
                f"mcp backend {self.name!r}: tools/list failed: {self._describe(exc)}"
            ) from exc
        capabilities = capabilities_from_tools(self.name, self._config, tools)
        self._upstream = {cap.id: cap.id.removeprefix(f"{self.name}.") for cap in capabilities}
        if self._config.resources is not None:
            capabilities.append(resource_capability(self.name, self._config))
        if self._config.prompts is not None:
            prompts: list[mcp_types.Prompt] = await all_pages(
                self.name,
                "prompts/list",
                self._config.timeout_s,
                lambda cursor: client.list_prompts(cursor=cursor, cache_mode="bypass"),
                lambda page: page.prompts,
                lambda page: page.next_cursor,
                self._describe,
            )
            relayed = prompt_capabilities(self.name, self._config, prompts)
            self._upstream.update({cap.id: cap.id.split("/", 2)[2] for cap in relayed})
            capabilities.extend(relayed)
        return capabilities

    # --- relayed listings (asked of the upstream each time; nothing is recorded) -------------------

    @property
    def uri_prefix(self) -> str | None:
        """What this backend puts before its resources' URIs; None when it relays none."""
        resources = self._config.resources
        return resources.uri_prefix if resources is not None else None

    async def list_resources(self) -> list[mcp_types.Resource]:
        """The upstream's resources, with their URIs as Writ shows them.

        Raises:
            BackendUnavailable: the upstream cannot be reached or the listing failed.
        """
        prefix = self.uri_prefix or ""
        client = await self._client_now()
        found: list[mcp_types.Resource] = await all_pages(
            self.name,
            "resources/list",
            self._config.timeout_s,
            lambda cursor: client.list_resources(cursor=cursor, cache_mode="bypass"),
            lambda page: page.resources,
            lambda page: page.next_cursor,
            self._describe,
        )
        return [r.model_copy(update={"uri": shown_uri(prefix, r.uri)}) for r in found]

    async def list_resource_templates(self) -> list[mcp_types.ResourceTemplate]:
        """The upstream's resource templates, with their URI templates as Writ shows them.

        Raises:
            BackendUnavailable: the upstream cannot be reached or the listing failed.
        """
        prefix = self.uri_prefix or ""
        client = await self._client_now()
        found: list[mcp_types.ResourceTemplate] = await all_pages(
            self.name,
            "resources/templates/list",
            self._config.timeout_s,
            lambda cursor: client.list_resource_templates(cursor=cursor, cache_mode="bypass"),
            lambda page: page.resource_templates,
            lambda page: page.next_cursor,
            self._describe,
        )
        return [t.model_copy(update={"uri_template": shown_uri(prefix, t.uri_template)}) for t in found]

    async def _opened(self, client: Client) -> None:
        """Beside each new session: its upstream subscriptions renewed, then its announcements heard."""
        await self._watched.renew(client, self._config.timeout_s)
        await self.announcements.listen(client)

    async def watch(self, uri: str, *, watching: bool) -> None:
        """Start (or stop) relaying updates of the resource at `uri`, as Writ shows it.

        Raises:
            BackendUnavailable: it is not this backend's, or the upstream takes no subscription of it.
        """
        upstream = upstream_uri(self.uri_prefix or "", uri)
        if upstream is None:
            raise BackendUnavailable(f"mcp backend {self.name!r} serves no {uri!r}")
        client = await self._client_now()
        if watching:
            await self._watched.watch(client, upstream, self._config.timeout_s)
        else:
            await self._watched.unwatch(client, upstream, self._config.timeout_s)

    async def complete(
        self,
        capability: Capability,
        ref: mcp_types.PromptReference | mcp_types.ResourceTemplateReference,
        argument: mcp_types.CompletionArgument,
        context: mcp_types.CompletionContext | None,
    ) -> mcp_types.CompleteResult:
        """The upstream's completion of an argument of one of its prompts or resource templates, `ref`
        naming it as Writ shows it.

        Raises:
            BackendUnavailable: the upstream cannot be reached, or did not answer usably.
        """
        upstream_ref: mcp_types.PromptReference | mcp_types.ResourceTemplateReference
        if isinstance(ref, mcp_types.PromptReference):
            upstream_ref = mcp_types.PromptReference(name=self._upstream.get(capability.id, ref.name))
        else:
            uri = upstream_uri(self.uri_prefix or "", ref.uri)
            if uri is None:
                raise BackendUnavailable(f"mcp backend {self.name!r} serves no {ref.uri!r}")
            upstream_ref = mcp_types.ResourceTemplateReference(uri=uri)
        client = await self._client_now()
        try:
            with anyio.fail_after(self._config.timeout_s):
                return await client.complete(
                    upstream_ref,
                    {"name": argument.name, "value": argument.value},
                    context.arguments if context is not None else None,
                )
        except (MCPError, TimeoutError, ValidationError, RuntimeError) as exc:
            raise BackendUnavailable(
                f"mcp backend {self.name!r}: completion/complete failed: {self._describe(exc)}"
            ) from exc

    async def _client_now(self) -> Client:
        session = await self._sessions.current()
        await self._check_token(self._config.timeout_s)
        assert session.client is not None
        return session.client

    # --- calls ---------------------------------------------------------------------------------------

    async def execute(self, invocation: Invocation) -> Outcome:
        """Call the upstream tool once (never raises for upstream behaviour)."""
        capability = invocation.capability
        upstream = self._upstream.get(capability.id)
        if capability.kind == "resource":
            upstream = upstream_uri(self.uri_prefix or "", str(invocation.arguments.get("uri", "")))
        if upstream is None:
            return failed_outcome(
                invocation, "unknown_capability", f"{capability.ref} is not served by {self.name}"
            )
        relay = current_relay()
        try:
            session, midcall = await self._session_for(relay)
            await self._check_token(capability.timeout_s)
        except BackendUnavailable as exc:
            return failed_outcome(invocation, "backend_unreachable", self._credentials.scrub(str(exc)))
        assert session.client is not None
        if capability.kind != "tool":
            with midcall.flying(relay):
                outcome = await self._relay(invocation, session, upstream)
            if relay is not None and (evidence := relay.evidence()):
                outcome = replace(outcome, evidence={**outcome.evidence, "relayed": evidence})
            return outcome
        meta: Any = {
            "writ/idempotencyKey": invocation.idempotency_key,
            "writ/requestId": invocation.external_request_id,
        }
        deadline = invocation.commit_deadline_text()
        if deadline is not None:
            meta["writ/commitDeadline"] = deadline
        with midcall.flying(relay):
            outcome = await self._send(invocation, session, upstream, meta, relay)
        if relay is not None and (evidence := relay.evidence()):
            outcome = replace(outcome, evidence={**outcome.evidence, "relayed": evidence})
        return outcome

    async def _send(
        self, invocation: Invocation, session: Session, upstream: str, meta: Any, relay: CallRelay | None
    ) -> Outcome:
        """Call the upstream tool, what it says meanwhile relayed to `relay`, and cancelled when the
        client cancels (a write then has an unknown outcome: the upstream may have acted)."""
        assert session.client is not None
        client = session.client
        capability = invocation.capability
        read_only = capability.effect == "read"
        if relay is not None and client.protocol_version in MODERN_PROTOCOL_VERSIONS:
            level = relay.log_level()
            if level is not None:
                meta[LOG_LEVEL_META_KEY] = level
        elif relay is not None:
            await self._ask_for_logs(session)
        try:
            result = await until_cancelled(
                relay,
                lambda: client.call_tool(
                    upstream,
                    dict(invocation.arguments),
                    read_timeout_seconds=capability.timeout_s,
                    meta=meta,
                    progress_callback=relay.progress if relay is not None else None,
                ),
            )
        except ClientCancelled:
            detail = (
                f"{self.name}: the client cancelled the call and Writ cancelled its request, which the "
                "upstream may have acted on already"
            )
            return unanswered_outcome(invocation, read_only, "cancelled_by_client", detail)
        except MCPError as exc:
            if is_refusal(exc):
                # A 2026-07-28 upstream asked for input Writ could not get: it was never given any,
                # so it did not go on with the call.
                return failed_outcome(invocation, "upstream_input_refused", self._describe(exc))
            return self._protocol_error(invocation, session, exc, read_only)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError) as exc:
            session.kill()
            return unanswered_outcome(invocation, read_only, "connection_lost", self._describe(exc))
        except (RuntimeError, ValidationError) as exc:
            # The upstream answered, but not with a result we can use (invalid shape or output schema).
            return unanswered_outcome(invocation, read_only, "invalid_response", self._describe(exc))
        if relay is not None:
            await relay.passed_on()
        return self._answered(invocation, result)

    async def _ask_for_logs(self, session: Session) -> None:
        """Ask a 2025-11-25 upstream once per session for all its log messages (`logging/setLevel`
        debug): each client is then given those at or above its own level."""
        client = session.client
        if session.logging_asked or client is None or client.server_capabilities.logging is None:
            return
        session.logging_asked = True
        try:
            with anyio.fail_after(self._config.timeout_s), warnings.catch_warnings():
                warnings.simplefilter("ignore", MCPDeprecationWarning)  # logging is deprecated at 2026-07-28
                await client.set_logging_level("debug")
        except (MCPError, TimeoutError, ValidationError, RuntimeError) as exc:
            logger.warning("mcp backend %r: logging/setLevel failed: %s", self.name, self._describe(exc))

    def _answered(self, invocation: Invocation, result: mcp_types.CallToolResult) -> Outcome:
        """The outcome of an upstream tool's answer."""
        read_only = invocation.capability.effect == "read"
        # An upstream that echoes its credential (plain, JSON-escaped, URL- or base64-encoded) must
        # not put it into the result, which is recorded and returned to the client. The result is
        # dumped once, as the JSON the rest of Writ keeps, and checked once.
        body: dict[str, Any] = self._credentials.scrub_json(
            {
                "content": [block.model_dump(by_alias=True, exclude_none=True) for block in result.content],
                "structuredContent": (
                    result.structured_content if isinstance(result.structured_content, dict) else None
                ),
                "isError": result.is_error,
            }
        )
        if not is_json(body):  # the SDK parses NaN and Infinity
            detail = f"{self.name}: the result holds NaN or Infinity, which JSON cannot carry"
            return unanswered_outcome(invocation, read_only, "invalid_response", detail)
        tool_result = ToolResult(
            content=tuple(body["content"]), structured=body["structuredContent"], is_error=result.is_error
        )
        if result.is_error:
            detail = self._credentials.scrub(_first_text(tool_result))[:_DETAIL_CHARS]
            if read_only or self._errors_before_effect(invocation.capability):
                return Outcome(
                    "failed",
                    tool_result,
                    error="tool_error",
                    detail=detail,
                    external_request_id=invocation.external_request_id,
                )
            # The SDK's servers answer this for any exception a tool raises, one raised after the tool
            # acted too (a receipt that failed to format): like an HTTP 500, the effect may be there.
            return Outcome(
                "unknown",
                error="tool_error",
                detail=detail,
                external_request_id=invocation.external_request_id,
                evidence={"answer": tool_result.to_json()},
            )
        return Outcome("completed", tool_result, external_request_id=invocation.external_request_id)

    def _errors_before_effect(self, capability: Capability) -> bool:
        """Whether the operator declared that this tool reports errors only before any effect."""
        upstream = self._upstream.get(capability.id)
        return upstream is not None and tool_errors_setting(self._config, upstream) == "before_effect"

    async def _relay(self, invocation: Invocation, session: Session, upstream: str) -> Outcome:
        """A resource read or prompt get, its answer kept as the result's structured content (as
        `ReadResourceResult` or `GetPromptResult` in JSON), scrubbed of the backend's credentials.
        What the upstream asks meanwhile (its input-required rounds) goes to the call's relay."""
        assert session.client is not None
        capability = invocation.capability
        answer: mcp_types.ReadResourceResult | mcp_types.GetPromptResult
        try:
            with anyio.fail_after(capability.timeout_s):
                if capability.kind == "resource":
                    read = await session.client.read_resource(upstream, cache_mode="bypass")
                    answer = prefixed_contents(self.uri_prefix or "", read)
                else:
                    arguments = {k: str(v) for k, v in invocation.arguments.items()}
                    got = await session.client.get_prompt(upstream, arguments)
                    answer = prefixed_messages(self.uri_prefix or "", got)
        except TimeoutError:
            detail = f"{self.name}: no answer within {capability.timeout_s:g}s"
            return unanswered_outcome(invocation, True, "response_timeout", detail)
        except MCPError as exc:
            if is_refusal(exc):  # it asked for input Writ could not get (see `_send`)
                return failed_outcome(invocation, "upstream_input_refused", self._describe(exc))
            return self._protocol_error(invocation, session, exc, True)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError) as exc:
            session.kill()
            return unanswered_outcome(invocation, True, "connection_lost", self._describe(exc))
        except (RuntimeError, ValidationError) as exc:
            return unanswered_outcome(invocation, True, "invalid_response", self._describe(exc))
        body = answer.model_dump(mode="json", by_alias=True, exclude_none=True)
        body.pop("resultType", None)
        body.pop("_meta", None)  # as from a tool result: the gateway answers with Writ's own
        result = ToolResult(structured=self._credentials.scrub_json(body))
        if not is_json(result.to_json()):
            detail = f"{self.name}: the answer holds NaN or Infinity, which JSON cannot carry"
            return unanswered_outcome(invocation, True, "invalid_response", detail)
        return Outcome("completed", result, external_request_id=invocation.external_request_id)

    async def reconcile(self, invocation: Invocation) -> ReconcileResult:
        """Look the earlier call up with the tool's `reconcile:` upstream tool (never raises for
        upstream behaviour: anything that does not say found or not found is inconclusive).

        Raises:
            CapabilityError: the tool has no lookup configured.
        """
        capability = invocation.capability
        upstream = self._upstream.get(capability.id)
        setting = reconcile_setting(self._config, upstream) if upstream is not None else None
        if setting is None or not capability.reconcilable:
            raise CapabilityError(f"{capability.ref} has no reconcile lookup")
        evidence: dict[str, Any] = {"lookup_tool": setting.tool}
        try:
            arguments = lookup_arguments(setting, invocation)
        except MissingField as missing:
            return ReconcileResult(
                "inconclusive", evidence={**evidence, "error": "invalid_lookup", "missing": missing.args[0]}
            )
        try:
            session = await self._sessions.current()
            await self._check_token(capability.timeout_s)
        except BackendUnavailable as exc:
            return ReconcileResult("inconclusive", evidence={**evidence, "error": self._describe(exc)})
        assert session.client is not None
        try:
            result = await session.client.call_tool(
                setting.tool, arguments, read_timeout_seconds=capability.timeout_s
            )
        except (MCPError, RuntimeError, ValidationError) as exc:
            too_large = isinstance(exc, MCPError) and self._too_large(exc)
            error = "response_too_large" if too_large else None
            return ReconcileResult(
                "inconclusive", evidence={**evidence, "error": error or self._describe(exc)}
            )
        except (anyio.ClosedResourceError, anyio.BrokenResourceError) as exc:
            session.kill()
            return ReconcileResult("inconclusive", evidence={**evidence, "error": self._describe(exc)})
        found = ToolResult(
            content=tuple(block.model_dump(by_alias=True, exclude_none=True) for block in result.content),
            structured=result.structured_content if isinstance(result.structured_content, dict) else None,
            is_error=result.is_error,
        )
        if not is_json(found.to_json()):
            return ReconcileResult("inconclusive", evidence={**evidence, "error": "invalid_response"})
        return verdict(found, setting, evidence, invocation)

    def _protocol_error(
        self, invocation: Invocation, session: Session, exc: MCPError, read_only: bool
    ) -> Outcome:
        detail = self._describe(exc)
        if exc.code == mcp_types.REQUEST_TIMEOUT:
            detail = f"{self.name}: no answer within {invocation.capability.timeout_s:g}s"
            return unanswered_outcome(invocation, read_only, "response_timeout", detail)
        if self._too_large(exc):
            # The answer came and was given up unread: the session itself is fine (or, if the stdio
            # reader gave its stream up, already reopened for the next call).
            detail = (
                f"{self.name}: answered with more than {self._config.max_response_bytes} bytes "
                f"({LIMIT_SETTING})"
            )
            return unanswered_outcome(invocation, read_only, "response_too_large", detail)
        if exc.code == mcp_types.CONNECTION_CLOSED:
            session.kill()
            return unanswered_outcome(invocation, read_only, "connection_lost", detail)
        if exc.code == mcp_types.INTERNAL_ERROR:
            # Like an HTTP 500: the handler may have acted before it failed.
            return unanswered_outcome(invocation, read_only, "upstream_internal_error", detail)
        if exc.message.startswith(ANSWERED_UNUSABLY):
            return unanswered_outcome(invocation, read_only, "invalid_response", detail)
        if exc.message == SESSION_TERMINATED:
            session.kill()
        failed = failed_outcome(invocation, f"mcp_error_{abs(exc.code)}", detail)
        required = required_capabilities(exc)
        if required is None or failed.result is None:
            return failed
        # Kept in the recorded result, so the edge can answer with the upstream's -32021 and its data.
        return replace(failed, result=replace(failed.result, structured={"requiredCapabilities": required}))

    async def _check_token(self, timeout_s: float) -> None:
        """Make sure an OAuth backend has a fresh token before the call leaves, so a token endpoint
        that fails means nothing was sent (the transport's auth flow then uses the cached token).

        Raises:
            BackendUnavailable: no token could be obtained in time.
        """
        tokens = self._credentials.tokens
        if tokens is None:
            return
        try:
            with anyio.fail_after(timeout_s):
                await tokens.authorization()
        except TimeoutError:
            raise BackendUnavailable(f"{self.name}: no access token within {timeout_s:g}s") from None

    # --- the client ------------------------------------------------------------------------------

    def _client(
        self,
        stack: AsyncExitStack,
        ended: Callable[[], None],
        declared: Declared = (True, True),
        midcall: MidCall | None = None,
    ) -> Client:
        """A client stating the capabilities `declared`, its callbacks routed by `midcall` (the first
        session's by default)."""
        callbacks = self._callbacks(declared, midcall)
        config = self._config
        if config.url is not None:
            tokens = self._credentials.tokens
            http = httpx2.AsyncClient(
                headers={**config.headers, **self._credentials.headers},
                timeout=httpx2.Timeout(30.0, read=300.0),
                auth=_TokenAuth(tokens) if tokens is not None else None,
                event_hooks={"response": [bounded_responses(config.max_response_bytes)]},
            )
            stack.push_async_callback(http.aclose)
            transport = streamable_http_client(
                config.url, http_client=http, max_sse_event_size=config.max_response_bytes
            )
            return Client(transport, mode=config.mode, **callbacks)
        assert config.command is not None
        cwd = Path(config.cwd) if config.cwd else None
        if cwd is not None and not cwd.is_absolute() and self._base_dir is not None:
            cwd = self._base_dir / cwd
        params = StdioServerParameters(
            command=config.command[0], args=config.command[1:], env=self._child_env or None, cwd=cwd
        )
        return Client(
            bounded_stdio_client(params, config.max_response_bytes, ended),
            mode=config.mode,
            **callbacks,
        )

    def _callbacks(self, declared: Declared, midcall: MidCall | None) -> dict[str, Any]:
        """The client's callbacks: what the upstream says during a call goes to that call's client.
        A callback left out is a capability the client does not state."""
        elicits, samples = declared
        routed = midcall or self._midcall
        # Every session hears list changes: a 2025-11-25 upstream may announce one only on the session
        # whose call made it.
        callbacks: dict[str, Any] = {
            "logging_callback": routed.on_log,
            "message_handler": self.announcements.handle,
        }
        if elicits:
            callbacks["elicitation_callback"] = routed.on_elicit
        if samples:
            callbacks["sampling_callback"] = routed.on_sample
        return callbacks

    # --- outcomes --------------------------------------------------------------------------------------

    def _too_large(self, exc: MCPError) -> bool:
        """Whether the transport failed the request because its answer passed `max_response_bytes`."""
        if exc.code == mcp_types.PARSE_ERROR:
            # Writ's own words, whatever the SDK puts around them: `bounded_http.ResponseTooLarge` (its
            # text is in the SDK's parse error) or `stdio_framing.too_large_message`. An upstream that
            # forged them would only turn its own refusal into `unknown`, never an answer into `failed`.
            return f"({LIMIT_SETTING})" in exc.message
        return exc.code == mcp_types.CONNECTION_CLOSED and exc.message.startswith(TOO_LARGE_SSE)

    def _describe(self, exc: BaseException) -> str:
        while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
            exc = exc.exceptions[0]
        text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        return self._credentials.scrub(text)[:_DETAIL_CHARS]


class _TokenAuth(httpx2.Auth):
    """Puts the backend's current OAuth access token on every request of the MCP transport."""

    def __init__(self, tokens: TokenSource) -> None:
        self._tokens = tokens

    async def async_auth_flow(
        self, request: httpx2.Request
    ) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        authorization = await self._tokens.authorization()
        request.headers["Authorization"] = authorization
        response = yield request
        if response.status_code == 401:
            self._tokens.invalidate(authorization)


def _first_text(result: ToolResult) -> str:
    for block in result.content:
        if block.get("type") == "text":
            return str(block.get("text", ""))
    return "the upstream tool reported an error"


MAX_REQUIRED_BYTES = 4096
"""The most of an upstream's `requiredCapabilities` kept (a capabilities object is small)."""


def required_capabilities(exc: MCPError) -> dict[str, Any] | None:
    """The client capabilities an upstream said a call needs (-32021, SEP-2575), if well formed:
    an object of objects keyed by capability, as JSON, of bounded size; else None."""
    if exc.code != mcp_types.MISSING_REQUIRED_CLIENT_CAPABILITY or not isinstance(exc.data, dict):
        return None
    required = exc.data.get("requiredCapabilities")
    if not isinstance(required, dict) or not required:
        return None
    if not all(isinstance(k, str) and isinstance(v, dict) for k, v in required.items()):
        return None
    if not is_json(required) or len(json.dumps(required)) > MAX_REQUIRED_BYTES:
        return None
    return required
