"""A startup that fails for a reason Writ knows is reported in one line, not in a traceback.

Executors start (and upstream MCP servers are asked for their tools) inside the ASGI lifespan, so an
upstream that cannot be reached surfaced as uvicorn printing a hundred lines of nested tracebacks with
the reason at the bottom. Starlette formats the traceback and sends it as the lifespan's failure
message while the exception is being handled; this middleware replaces that message with the reason.
"""

from __future__ import annotations

import sys

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from capabilities.contract import CapabilityError
from gateway.errors import GatewayError
from store.model import StoreError

KNOWN = (CapabilityError, GatewayError, StoreError)


def known_cause(error: BaseException | None) -> BaseException | None:
    """The error itself, or the only error of a task group, when it is one of Writ's own."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error if isinstance(error, KNOWN) else None


class StartupErrors:
    """ASGI middleware: a lifespan startup failure caused by Writ's own error says only that error."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def reporting_send(message: Message) -> None:
            if message["type"] == "lifespan.startup.failed":
                cause = known_cause(sys.exc_info()[1])
                if cause is not None:
                    message = {**message, "message": f"writ cannot start: {cause}"}
            await send(message)

        await self.app(scope, receive, reporting_send)
