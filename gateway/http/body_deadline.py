"""A deadline for a request's body: a client that stalls or trickles it gets 408, and nothing runs.

The MCP SDK bounds a body's size (`RequestBodyLimitMiddleware`, 4 MiB), not how long it may take to
arrive, and neither does uvicorn: a client that sends its headers and then the body a byte a minute,
or none of it, holds a connection and a request task as long as it likes. This middleware gives each
request `timeout_s` from its headers until its body is complete (`more_body: false`). When the
application waits for more past that, it is cancelled inside that wait (it cannot have acted on a body
it has not read) and the client gets 408 with `connection: close`: on /mcp a JSON-RPC error, as the
SDK answers other bad requests there, elsewhere Writ's API error shape. Once the body is in,
`receive` is the server's own again (a stream waiting for the client to disconnect is not timed).

The headers are bounded before the application is called, in `gateway.http.header_deadline`.
"""

from __future__ import annotations

import logging

import anyio
import anyio.lowlevel
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.reasons import ReasonCode, http_status

logger = logging.getLogger(__name__)

INVALID_REQUEST = -32600


class BodyDeadline:
    """ASGI middleware: an HTTP request's body must be complete within `timeout_s` of its headers."""

    def __init__(self, app: ASGIApp, timeout_s: float) -> None:
        self.app = app
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        deadline = anyio.current_time() + self.timeout_s
        body_complete = timed_out = response_started = False

        async def receive_in_time() -> Message:
            nonlocal body_complete, timed_out
            if body_complete:
                return await receive()
            with anyio.CancelScope(deadline=deadline):
                message = await receive()
                if message["type"] != "http.request" or not message.get("more_body", False):
                    body_complete = True
                return message
            timed_out = True
            application.cancel()
            await anyio.lowlevel.checkpoint()  # delivers the cancellation
            raise AssertionError("unreachable: the application's scope is cancelled")  # pragma: no cover

        async def send_tracked(message: Message) -> None:
            nonlocal response_started
            if message["type"] == "http.response.start":
                response_started = True
            await send(message)

        with anyio.CancelScope() as application:
            await self.app(scope, receive_in_time, send_tracked)
        if not timed_out:
            return
        logger.info("request body from %s not received within %g s", scope.get("client"), self.timeout_s)
        if not response_started:  # else the server closes the connection of an unfinished response
            await self._timeout_response(scope)(scope, receive, send)

    def _timeout_response(self, scope: Scope) -> JSONResponse:
        return timeout_response(scope, self.timeout_s)


def timeout_response(scope: Scope, timeout_s: float) -> JSONResponse:
    """408 with `connection: close`: on /mcp a JSON-RPC error, elsewhere Writ's API error shape."""
    message = f"request body not received within {timeout_s:g} s"
    headers = {"connection": "close"}
    status = http_status(ReasonCode.REQUEST_TIMEOUT)
    if scope["path"] == "/mcp" or scope["path"].startswith("/mcp/"):
        error = {"code": INVALID_REQUEST, "message": message}
        return JSONResponse({"jsonrpc": "2.0", "id": None, "error": error}, status, headers)
    return JSONResponse({"error": ReasonCode.REQUEST_TIMEOUT, "error_description": message}, status, headers)
