"""A bound on request bodies outside /mcp, before any handler reads one.

Starlette reads a whole body into memory (`request.body()`, `request.json()`), and pydantic then
holds it again while parsing: a 300 MB decision POST from any authenticated agent took the gateway to
about 1 GB. The MCP SDK bounds /mcp itself (4 MiB); the API and console bodies are a decision, a
reason, a resolution or a pasted token, so a small bound costs nothing.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.reasons import ReasonCode, http_status

MAX_BODY_BYTES = 1024 * 1024


class _TooLarge(Exception):
    pass


class BodyLimit:
    """ASGI middleware: a body over `limit` bytes is answered 413 and read no further (/mcp excepted)."""

    def __init__(self, app: ASGIApp, limit: int = MAX_BODY_BYTES, exempt: str = "/mcp") -> None:
        self.app = app
        self.limit = limit
        self.exempt = exempt

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path == self.exempt or path.startswith(self.exempt + "/"):
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.limit:
            await self._refuse(send)
            return
        received = 0
        started = False

        async def bounded_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:  # a chunked body, or one longer than it declared
                    raise _TooLarge
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, bounded_receive, tracking_send)
        except _TooLarge:
            if not started:
                await self._refuse(send)

    async def _refuse(self, send: Send) -> None:
        await refuse_too_large(self.limit, send)


async def refuse_too_large(limit: int, send: Send) -> None:
    """Answer 413: the body is over `limit` bytes."""
    code = ReasonCode.REQUEST_TOO_LARGE
    body = json.dumps({"error": code, "error_description": f"the body is over {limit} bytes"}).encode()
    # What is left of the body is discarded by uvicorn as it arrives (never buffered), so the
    # connection stays usable and the client reads this answer instead of a reset.
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": http_status(code), "headers": headers})
    await send({"type": "http.response.body", "body": body})
