"""A bare MCP proxy: the ceiling that the MCP SDK stack itself puts on any gateway written with it.

    python -m bench.bare_proxy --port P --backend http://127.0.0.1:B [--sse]
    python -m bench.bare_proxy --port P --upstream-mcp http://127.0.0.1:U/mcp [--sse]

The same low-level `mcp.server.Server`, `StreamableHTTPSessionManager` and uvicorn that `writ serve`
uses, exposing `lookup_order` and `refund_order`, each forwarded to acme-payments over one persistent
httpx2 client, or (`--upstream-mcp`) to an upstream MCP server over one persistent `mcp.Client`
session, its result passed back as it came. Nothing else: no auth, no policy, no schema check, no
store. The benchmark runs it beside Writ so that the table separates what the protocol stack costs
from what Writ adds; with `--backend` it is also the upstream MCP server of the MCP scenario.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import mcp_types as types
import uvicorn
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

_ANY_OBJECT: dict[str, Any] = {"type": "object"}
TOOLS = [
    types.Tool(name="lookup_order", input_schema=_ANY_OBJECT),
    types.Tool(name="refund_order", input_schema=_ANY_OBJECT),
]


UPSTREAM_MODE = "2026-07-28"
"""The protocol the proxy speaks to an upstream MCP server (the benchmark sets Writ's `mode` alike)."""


def build(backend_url: str | None, *, json_response: bool, upstream_mcp: str | None = None) -> Starlette:
    if upstream_mcp is not None:
        return _serve(_McpForwarder(upstream_mcp), json_response=json_response)
    if backend_url is None:
        raise ValueError("give a backend URL or an upstream MCP URL")
    return _serve(_HttpForwarder(backend_url), json_response=json_response)


class _HttpForwarder:
    """Each call as one request to acme-payments, over one persistent connection."""

    def __init__(self, backend_url: str) -> None:
        self.http = httpx2.AsyncClient(base_url=backend_url, timeout=30)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        async with self.http:
            yield

    async def call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        http = self.http
        arguments = params.arguments or {}
        if params.name == "lookup_order":
            response = await http.get(f"/orders/{arguments['order_id']}")
        else:
            key = str((params.meta or {}).get("writ/idempotencyKey", ""))
            response = await http.post("/refunds", json=arguments, headers={"Idempotency-Key": key})
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=response.text)],
            structured_content=response.json(),
            is_error=response.status_code >= 400,
        )


class _McpForwarder:
    """Each call as one tools/call on a persistent session with the upstream MCP server."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.client: Client | None = None

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        async with (
            httpx2.AsyncClient(timeout=30) as http,
            Client(streamable_http_client(self.url, http_client=http), mode=UPSTREAM_MODE) as client,
        ):
            self.client = client
            yield

    async def call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        if self.client is None:
            raise RuntimeError("the upstream session is not open")
        return await self.client.call_tool(params.name, params.arguments or {}, meta=params.meta)


def _serve(forwarder: _HttpForwarder | _McpForwarder, *, json_response: bool) -> Starlette:
    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=TOOLS)

    server: Server[Any] = Server("bare-proxy", on_list_tools=list_tools, on_call_tool=forwarder.call_tool)
    manager = StreamableHTTPSessionManager(
        app=server,
        json_response=json_response,
        security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )

    async def healthz(request: Request) -> Response:
        return JSONResponse({"ok": True})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with forwarder.running(), manager.run():
            yield

    return Starlette(
        routes=[Route("/healthz", healthz), Route("/mcp", endpoint=StreamableHTTPASGIApp(manager))],
        lifespan=lifespan,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--backend", help="acme-payments base URL")
    target.add_argument("--upstream-mcp", help="an upstream MCP server's streamable HTTP URL")
    parser.add_argument("--sse", action="store_true", help="answer in SSE instead of JSON")
    args = parser.parse_args()
    app = build(args.backend, json_response=not args.sse, upstream_mcp=args.upstream_mcp)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
