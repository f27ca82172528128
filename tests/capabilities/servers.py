"""Real servers for the executor tests: an HTTP backend and an upstream MCP server, each under uvicorn
on a free 127.0.0.1 port in a background thread, with counters the tests read."""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import anyio
import mcp_types
import uvicorn
from mcp.server import Server
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

TOKEN = "s3cret-backend-token"
HANG_S = 20.0


@dataclass
class ServerState:
    """What a test server saw; written by the server thread, read by tests."""

    hits: Counter[str] = field(default_factory=Counter)
    headers: list[dict[str, str]] = field(default_factory=list)
    bodies: list[Any] = field(default_factory=list)
    refunds: dict[str, dict[str, Any]] = field(default_factory=dict)
    meta: list[dict[str, Any]] = field(default_factory=list)
    writes: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Upstream `write_file` effects by the idempotency key in the call's _meta."""
    answer: tuple[int, str] = (200, "[]")
    """What `GET /answer` (HTTP) answers: status and body; the `find_answer` tool (MCP) answers the body."""
    closing: bool = False
    slow_in_flight: int = 0
    most_slow_in_flight: int = 0
    """How many `slow` calls the upstream was running at once, at most."""

    def see(self, key: str, request: Request | None = None, body: Any = None) -> None:
        self.hits[key] += 1
        if request is not None:
            self.headers.append({k.lower(): v for k, v in request.headers.items()})
        self.bodies.append(body)

    async def hang(self) -> None:
        deadline = time.monotonic() + HANG_S
        while not self.closing and time.monotonic() < deadline:
            await anyio.sleep(0.05)


@contextmanager
def serve(app: Any, state: ServerState, port: int | None = None) -> Iterator[str]:
    """Serve `app` in a thread; yields `http://127.0.0.1:<port>`."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port or 0))
    config = uvicorn.Config(app, log_level="critical", timeout_graceful_shutdown=1, ws="none")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("test server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        state.closing = True
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
        state.closing = False


# --- the HTTP backend ------------------------------------------------------------------------------


def http_backend_app(state: ServerState) -> Starlette:
    """A small payments API: answers, rejects, fails after committing, hangs, drops connections."""

    def authorized(request: Request) -> bool:
        return request.headers.get("authorization") == f"Bearer {TOKEN}"

    async def create_refund(request: Request) -> Response:
        body = await request.json()
        state.see("refunds", request, body)
        if not authorized(request):
            return JSONResponse({"error": "unauthorized"}, status_code=401)
        key = request.headers["idempotency-key"]
        refund = {"refund_id": f"r{len(state.refunds) + 1}", "idempotency_key": key, **body}
        state.refunds[key] = refund
        return JSONResponse(refund, status_code=201)

    async def find_refunds(request: Request) -> Response:
        state.see("find_refunds", request)
        key = request.query_params.get("idempotency_key")
        return JSONResponse([r for r in state.refunds.values() if r["idempotency_key"] == key])

    async def find_flagged(request: Request) -> Response:
        key = request.query_params.get("idempotency_key")
        refund = state.refunds.get(key or "")
        return JSONResponse({"found": True, **refund} if refund else {"found": False, "checked": key})

    async def answer(request: Request) -> Response:
        state.see("answer", request)
        status, body = state.answer
        return Response(body, status_code=status, media_type="application/json")

    async def get_order(request: Request) -> Response:
        order_id = request.path_params["order_id"]
        state.see("orders", request)
        if order_id == "missing":
            return JSONResponse({"error": "no such order"}, status_code=404)
        return JSONResponse({"order_id": order_id, "query": dict(request.query_params)})

    async def reject(request: Request) -> Response:
        state.see("reject", request, await request.json())
        return JSONResponse({"error": "amount over limit"}, status_code=422)

    async def commit_then_500(request: Request) -> Response:
        state.see("commit_then_500", request, await request.json())
        state.refunds[request.headers["idempotency-key"]] = {"committed": True}
        return PlainTextResponse("database hiccup after commit", status_code=500)

    async def hang(request: Request) -> Response:
        state.see("hang", request)
        await state.hang()
        return JSONResponse({"late": True})

    async def text(request: Request) -> Response:
        state.see("text", request)
        return PlainTextResponse("pong")

    async def numbers(request: Request) -> Response:
        state.see("numbers", request)
        return JSONResponse([1, 2, 3])

    async def leak(request: Request) -> Response:
        state.see("leak", request)
        return PlainTextResponse(
            f"bad request, you sent {request.headers.get('authorization')}", status_code=400
        )

    async def echo_encoded(request: Request) -> Response:
        # What a careless backend does with the credential it was sent: quote it back, encoded.
        state.see("echo_encoded", request)
        token = (request.headers.get("authorization") or "").removeprefix("Bearer ")
        as_json = json.dumps(token)[1:-1].replace("/", "\\/")  # as PHP's json_encode writes it
        as_url = quote(token, safe="")
        as_base64 = base64.b64encode(token.encode()).decode()
        as_basic = base64.b64encode(f"writ:{token}".encode()).decode()  # inside a longer encoding
        body = (
            f'{{"you_sent": "{as_json}", "next": "/continue?token={as_url}", '
            f'"b64": "{as_base64}", "basic": "Basic {as_basic}"}}'
        )
        return Response(body, media_type="application/json")

    routes = [
        Route("/refunds", create_refund, methods=["POST"]),
        Route("/refunds", find_refunds, methods=["GET"]),
        Route("/refunds/lookup", find_flagged, methods=["GET"]),
        Route("/answer", answer, methods=["GET"]),
        Route("/orders/{order_id}", get_order, methods=["GET"]),
        Route("/reject", reject, methods=["POST"]),
        Route("/commit-then-500", commit_then_500, methods=["POST", "GET"]),
        Route("/hang", hang, methods=["POST", "GET"]),
        Route("/text", text, methods=["GET"]),
        Route("/numbers", numbers, methods=["GET"]),
        Route("/leak", leak, methods=["GET"]),
        Route("/echo-encoded", echo_encoded, methods=["GET"]),
    ]
    inner = Starlette(routes=routes)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/drop":
            # Promise a body, send part of it, then give up: the client sees the connection end.
            state.hits["drop"] += 1
            await send(
                {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"100")]}
            )
            await send({"type": "http.response.body", "body": b'{"partial"', "more_body": True})
            raise ConnectionAbortedError("dropped on purpose")
        await inner(scope, receive, send)

    return app  # type: ignore[return-value]


# --- the upstream MCP server -----------------------------------------------------------------------


def upstream_tools() -> list[mcp_types.Tool]:
    obj = {"type": "object"}
    return [
        mcp_types.Tool(
            name="read_file",
            description="Read a file.",
            input_schema={"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
            annotations=mcp_types.ToolAnnotations(read_only_hint=True),
        ),
        mcp_types.Tool(name="write_file", description="Write a file.", input_schema=obj),
        mcp_types.Tool(name="fail", description="Always reports an error.", input_schema=obj),
        mcp_types.Tool(name="slow", description="Takes a moment.", input_schema=obj),
        mcp_types.Tool(name="hang", description="Never answers in time.", input_schema=obj),
        mcp_types.Tool(name="boom", description="Raises inside the handler.", input_schema=obj),
        mcp_types.Tool(name="admin_reset", description="Not for agents.", input_schema=obj),
        mcp_types.Tool(name="find_writes", description="Writes with this key, as a list.", input_schema=obj),
        mcp_types.Tool(
            name="find_write", description="The write with this key, found or not.", input_schema=obj
        ),
        mcp_types.Tool(name="find_answer", description="Answers what the test set.", input_schema=obj),
    ]


def mcp_upstream_server(state: ServerState) -> Server[Any]:
    async def list_tools(ctx: Any, params: Any) -> mcp_types.ListToolsResult:
        return mcp_types.ListToolsResult(tools=upstream_tools())

    async def call_tool(ctx: Any, params: mcp_types.CallToolRequestParams) -> mcp_types.CallToolResult:
        request = ctx.request
        state.see(params.name, request, params.arguments)
        state.meta.append(dict(params.meta or {}))
        auth = request.headers.get("authorization") if request is not None else None
        if params.name == "fail":
            return mcp_types.CallToolResult(
                content=[mcp_types.TextContent(type="text", text="disk full")], is_error=True
            )
        if params.name == "slow":
            state.slow_in_flight += 1
            state.most_slow_in_flight = max(state.most_slow_in_flight, state.slow_in_flight)
            try:
                await anyio.sleep(0.4)
            finally:
                state.slow_in_flight -= 1
        if params.name == "hang":
            await state.hang()
        if params.name == "boom":
            raise RuntimeError("handler crashed")
        if (params.arguments or {}).get("echo") == "credential":
            # A careless upstream quoting back the credential it was sent, in three encodings.
            token = (auth or "").removeprefix("Bearer ")
            echoed = {
                "escaped": json.dumps(token)[1:-1].replace("/", "\\/"),
                "url": quote(token, safe=""),
                "b64": base64.b64encode(f"writ:{token}".encode()).decode(),
            }
            return mcp_types.CallToolResult(
                content=[mcp_types.TextContent(type="text", text=json.dumps(echoed))],
                structured_content={"echoed": echoed},
            )
        key = (params.arguments or {}).get("key")
        if params.name == "find_writes":
            found = {"writes": [state.writes[key]] if key in state.writes else []}
            return mcp_types.CallToolResult(content=[], structured_content=found)
        if params.name == "find_answer":
            return mcp_types.CallToolResult(content=[], structured_content=json.loads(state.answer[1]))
        if params.name == "find_write":
            record = state.writes.get(key)
            found = {"found": record is not None, "write": record}
            return mcp_types.CallToolResult(content=[], structured_content=found)
        if params.name == "write_file" and params.meta and "writ/idempotencyKey" in params.meta:
            written_key = params.meta["writ/idempotencyKey"]
            state.writes[written_key] = {"key": written_key, "args": params.arguments or {}}
        payload = {
            "tool": params.name,
            "args": params.arguments or {},
            "authorized": auth == f"Bearer {TOKEN}",
        }
        return mcp_types.CallToolResult(
            content=[mcp_types.TextContent(type="text", text=json.dumps(payload))], structured_content=payload
        )

    return Server("test-upstream", on_list_tools=list_tools, on_call_tool=call_tool)
