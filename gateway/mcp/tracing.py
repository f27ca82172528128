"""The MCP server span of each request, by the MCP semantic conventions, and its duration metric.

The MCP SDK makes the SERVER span `{mcp.method.name} {target}` itself (`mcp.server._otel`, which
`sdk.py` finds: method, protocol version, JSON-RPC request id, tool name, `error.type`), parented by the
trace context in the request's `params._meta` (`traceparent`, `tracestate`) or else by the HTTP
request's. Writ keeps it: `Activate` runs outside it, so it reaches Writ's exporter, and `Describe` runs
inside it, adding what the SDK leaves out (session, transport, network peer) and recording
`mcp.server.operation.duration`.
"""

from __future__ import annotations

import time
from typing import Any

import mcp_types as types
from mcp.server import Server
from mcp.server.context import CallNext, HandlerResult
from mcp.shared.exceptions import MCPError
from opentelemetry import trace
from pydantic import ValidationError

from gateway.mcp.sdk import sdk_span_index
from gateway.telemetry import Telemetry, session_label

SESSION_HEADER = "mcp-session-id"


class Activate:
    """Outermost: spans of this request, the SDK's included, go to this gateway's tracer provider."""

    def __init__(self, telemetry: Telemetry) -> None:
        self._telemetry = telemetry

    async def __call__(self, ctx: Any, call_next: CallNext) -> HandlerResult:
        with self._telemetry.activated():
            return await call_next(ctx)


class Describe:
    """Inside the SDK's span: the attributes it lacks, and the operation's duration metric."""

    def __init__(self, telemetry: Telemetry, transport: str | None) -> None:
        self._telemetry = telemetry
        self._transport = transport

    async def __call__(self, ctx: Any, call_next: CallNext) -> HandlerResult:
        span = trace.get_current_span()
        described = self._describe(ctx)
        span.set_attributes(described)
        labels: dict[str, str] = {
            key: str(described[key])
            for key in (
                "mcp.method.name",
                "mcp.protocol.version",
                "network.transport",
                "network.protocol.name",
            )
            if key in described
        }
        name = ctx.params.get("name") if ctx.params else None
        if ctx.method == "tools/call":
            labels["gen_ai.operation.name"] = "execute_tool"
            if isinstance(name, str):
                labels["gen_ai.tool.name"] = name
        elif ctx.method == "prompts/get" and isinstance(name, str):
            labels["gen_ai.prompt.name"] = name
        started = time.perf_counter()
        try:
            result = await call_next(ctx)
        except MCPError as exc:
            labels["error.type"] = labels["rpc.response.status_code"] = str(exc.error.code)
            raise
        except ValidationError:
            labels["error.type"] = labels["rpc.response.status_code"] = str(types.INVALID_PARAMS)
            raise
        except Exception as exc:
            labels["error.type"] = type(exc).__qualname__
            raise
        else:
            if ctx.method == "tools/call" and _is_error(result):
                labels["error.type"] = "tool_error"  # as the SDK marks its span
            return result
        finally:
            self._telemetry.mcp_operation(time.perf_counter() - started, labels)

    def _describe(self, ctx: Any) -> dict[str, str | int]:
        attributes: dict[str, str | int] = {
            "mcp.method.name": ctx.method,
            "jsonrpc.protocol.version": "2.0",
        }
        if ctx.protocol_version:
            attributes["mcp.protocol.version"] = ctx.protocol_version
        request = ctx.request
        headers = getattr(request, "headers", None)
        if headers is not None:  # streamable HTTP
            attributes["network.transport"] = "tcp"
            attributes["network.protocol.name"] = "http"
            scope = getattr(request, "scope", {})
            if version := scope.get("http_version"):
                attributes["network.protocol.version"] = version
            if session := headers.get(SESSION_HEADER):
                attributes["mcp.session.id"] = session_label(session)
            client = getattr(request, "client", None)
            if client is not None:
                attributes["client.address"] = client.host
                attributes["client.port"] = client.port
        elif self._transport:
            attributes["network.transport"] = self._transport
        return attributes


def _is_error(result: Any) -> bool:
    if isinstance(result, types.CallToolResult):
        return bool(result.is_error)
    return isinstance(result, dict) and result.get("isError") is True


def instrument(server: Server[Any], telemetry: Telemetry, transport: str | None = None) -> None:
    """Put Writ's two middlewares around and inside the SDK's OpenTelemetry span.

    `transport` is `network.transport` for requests that do not come over HTTP (`pipe` for stdio).
    """
    sdk = sdk_span_index(server.middleware)
    if sdk is None:  # an SDK without its span: Writ's attributes go on whatever span is current
        server.middleware.insert(0, Describe(telemetry, transport))
    else:
        server.middleware.insert(sdk + 1, Describe(telemetry, transport))
    server.middleware.insert(0, Activate(telemetry))
