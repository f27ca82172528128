"""A bare MCP proxy: the ceiling that the MCP SDK stack itself puts on any gateway written with it.

    python -m bench.bare_proxy --port P --backend http://127.0.0.1:B [--json-response | --sse]

The same low-level `mcp.server.Server`, `StreamableHTTPSessionManager` and uvicorn that `writ serve`
uses, exposing `lookup_order` and `refund_order`, each forwarded to acme-payments over one persistent
httpx2 client. Nothing else: no auth, no policy, no schema check, no store. The benchmark runs it
beside Writ so that the table separates what the protocol stack costs from what Writ adds.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import mcp_types as types
import uvicorn
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


def build(backend_url: str, *, json_response: bool) -> Starlette:
    http = httpx2.AsyncClient(base_url=backend_url, timeout=30)

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=TOOLS)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
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

    server: Server[Any] = Server("bare-proxy", on_list_tools=list_tools, on_call_tool=call_tool)
    manager = StreamableHTTPSessionManager(
        app=server,
        json_response=json_response,
        security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )

    async def healthz(request: Request) -> Response:
        return JSONResponse({"ok": True})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with http, manager.run():
            yield

    return Starlette(
        routes=[Route("/healthz", healthz), Route("/mcp", endpoint=StreamableHTTPASGIApp(manager))],
        lifespan=lifespan,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--backend", required=True, help="acme-payments base URL")
    parser.add_argument("--sse", action="store_true", help="answer in SSE instead of JSON")
    args = parser.parse_args()
    app = build(args.backend, json_response=not args.sse)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
