"""The HTTP edge in one ASGI layer: every step that used to be a middleware of its own, in their order.

Each middleware of the old stack wrapped `receive` and `send` and added its frames to every request;
this layer does the same steps with one wrapper of each, in the order the stack ran them:

1. a lifespan startup failure caused by Writ's own error says only that error (`startup_errors`, whose
   `known_cause` the composition root passes in: it knows the errors of the layers above this one);
2. the request's W3C trace context is current while it is served (`tracing`);
3. each answer of an edge-refusal status is noted as `security.edge_refused` (`refusals`);
4. the body must be complete within `timeout_s` of the headers, else 408 (`body_deadline`);
5. a body outside /mcp over `limit` bytes is answered 413 and read no further (`bodies`);
6. SP and HTAB around header values are stripped (`headers`);
7. bearer authentication sets `scope["auth"]` and `scope["user"]` as Starlette's
   AuthenticationMiddleware does (a refused token is answered by `on_error`), and an authenticated
   user is put in the MCP SDK's auth context, which `get_access_token` reads.

The modules named keep each step's reasons; what each answers is tested there and through the app.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

import anyio
import anyio.lowlevel
from mcp.server.auth.middleware.auth_context import auth_context_var
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from opentelemetry import context, propagate
from starlette.authentication import (
    AuthCredentials,
    AuthenticationBackend,
    AuthenticationError,
    BaseUser,
    UnauthenticatedUser,
)
from starlette.requests import HTTPConnection
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.audit.security import SecurityRefusal, SecuritySink, shown
from gateway.http.bodies import MAX_BODY_BYTES, refuse_too_large
from gateway.http.body_deadline import timeout_response
from gateway.http.refusals import refusal_kind
from gateway.http.tracing import TRACE_HEADERS
from gateway.telemetry import Telemetry

logger = logging.getLogger(__name__)

_OWS = b" \t"


class _TooLarge(Exception):
    pass


class Edge:
    """ASGI middleware: the HTTP edge's steps (module docstring) in one layer."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        telemetry: Telemetry,
        security: SecuritySink,
        backend: AuthenticationBackend,
        on_error: Callable[[HTTPConnection, AuthenticationError], Response],
        body_timeout_s: float,
        known_cause: Callable[[BaseException | None], BaseException | None] = lambda error: None,
        body_limit: int = MAX_BODY_BYTES,
        unlimited: str = "/mcp",
    ) -> None:
        self.app = app
        self.telemetry = telemetry
        self.security = security
        self.backend = backend
        self.on_error = on_error
        self.known_cause = known_cause
        self.body_timeout_s = body_timeout_s
        self.body_limit = body_limit
        self.unlimited = unlimited

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # One coroutine frame for an HTTP request, the steps inline: each frame between the server and
        # the application is entered again every time the request's task resumes.
        if scope["type"] != "http":
            await self._not_http(scope, receive, send)
            return
        carrier: dict[str, str] = {}
        for name, value in scope["headers"]:
            if name.lower() in TRACE_HEADERS:
                carrier[name.decode("latin-1")] = value.decode("latin-1")
        token = context.attach(propagate.extract(carrier)) if carrier else None
        path: str = scope.get("path", "")
        limited = not (path == self.unlimited or path.startswith(self.unlimited + "/"))
        deadline = anyio.current_time() + self.body_timeout_s
        body_complete = timed_out = started = False
        received = 0

        async def edge_receive() -> Message:
            nonlocal body_complete, timed_out, received
            if body_complete:
                message = await receive()
            else:
                with anyio.CancelScope(deadline=deadline) as waiting:
                    message = await receive()
                    if message["type"] != "http.request" or not message.get("more_body", False):
                        body_complete = True
                if waiting.cancelled_caught:
                    timed_out = True
                    application.cancel()
                    await anyio.lowlevel.checkpoint()  # delivers the cancellation
                    raise AssertionError("unreachable: the application is cancelled")  # pragma: no cover
            if limited and message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.body_limit:  # a chunked body, or one longer than it declared
                    raise _TooLarge
            return message

        async def edge_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                self._note(scope, message)
            await send(message)

        try:
            with self.telemetry.activated():
                with anyio.CancelScope() as application:
                    declared = dict(scope["headers"]).get(b"content-length", b"") if limited else b""
                    if declared.isdigit() and int(declared) > self.body_limit:
                        await refuse_too_large(self.body_limit, edge_send)
                    else:
                        try:
                            await self._as_user(_trimmed(scope), edge_receive, edge_send)
                        except _TooLarge:
                            if not started:
                                await refuse_too_large(self.body_limit, edge_send)
                if timed_out:
                    client = scope.get("client")
                    logger.info("request body from %s not received within %g s", client, self.body_timeout_s)
                    if not started:  # else the server closes the connection of an unfinished response
                        await timeout_response(scope, self.body_timeout_s)(scope, receive, edge_send)
        finally:
            if token is not None:
                context.detach(token)

    async def _not_http(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":

            async def reporting_send(message: Message) -> None:
                if message["type"] == "lifespan.startup.failed":
                    cause = self.known_cause(sys.exc_info()[1])
                    if cause is not None:
                        message = {**message, "message": f"writ cannot start: {cause}"}
                await send(message)

            await self.app(scope, receive, reporting_send)
        elif kind == "websocket":
            await self._as_user(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _as_user(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the app for the connection's user (in `auth_context_var`), for no one when it named
        none, or not at all when `_authenticate` answered it (a refusal)."""
        user = await self._authenticate(scope, receive, send)
        if isinstance(user, AuthenticatedUser):
            reset = auth_context_var.set(user)
            try:
                await self.app(scope, receive, send)
            finally:
                auth_context_var.reset(reset)
        elif user is not None:
            await self.app(scope, receive, send)

    def _note(self, scope: Scope, start: Message) -> None:
        path = scope.get("path", "")
        kind = refusal_kind(path, start["status"], list(start.get("headers", [])))
        if kind is not None:
            client = scope.get("client")
            self.security.note(
                SecurityRefusal(
                    "security.edge_refused", kind, source=client[0] if client else None, path=shown(path)
                )
            )

    async def _authenticate(self, scope: Scope, receive: Receive, send: Send) -> BaseUser | None:
        """Sets `scope["auth"]` and `scope["user"]` as Starlette's AuthenticationMiddleware does and
        returns the user, or answers a refused token and returns None."""
        conn = HTTPConnection(scope)
        try:
            found = await self.backend.authenticate(conn)
        except AuthenticationError as exc:
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1000})
            else:
                await self.on_error(conn, exc)(scope, receive, send)
            return None
        credentials, user = found if found is not None else (AuthCredentials(), UnauthenticatedUser())
        scope["auth"], scope["user"] = credentials, user
        return user


def _trimmed(scope: Scope) -> Scope:
    """`scope` with SP and HTAB stripped around header values (RFC 9110 §5.5), when any has them."""
    headers = scope["headers"]
    for _, value in headers:
        if value[-1:] in (b" ", b"\t") or value[:1] in (b" ", b"\t"):
            return {**scope, "headers": [(name, value.strip(_OWS)) for name, value in headers]}
    return scope
