"""The trace an HTTP request arrives in: W3C `traceparent` and `tracestate` from its headers.

Everything the request causes (the MCP SDK's server span, unless the MCP request's `params._meta`
names a trace of its own; Writ's spans; store transactions of the API) continues the client's trace,
and goes to this gateway's tracer provider (`Telemetry.activated`).
"""

from __future__ import annotations

from opentelemetry import context, propagate
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.telemetry import Telemetry

TRACE_HEADERS = (b"traceparent", b"tracestate")


class TraceContext:
    """ASGI middleware: the request's trace context is current while the request is served."""

    def __init__(self, app: ASGIApp, telemetry: Telemetry) -> None:
        self.app = app
        self.telemetry = telemetry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        carrier = {
            name.decode("latin-1"): value.decode("latin-1")
            for name, value in scope.get("headers", ())
            if name.lower() in TRACE_HEADERS
        }
        token = context.attach(propagate.extract(carrier)) if carrier else None
        try:
            with self.telemetry.activated():
                await self.app(scope, receive, send)
        finally:
            if token is not None:
                context.detach(token)
