"""Header values as RFC 9110 defines them, before anything in the application reads one.

A field value excludes the whitespace around it (RFC 9110 §5.5: "leading and trailing whitespace
(OWS) ... excluded by parsers when extracting the field value"). uvicorn's httptools parser drops the
leading whitespace but keeps the trailing, so `Mcp-Name: refund_order ` did not match the body's
`refund_order` and a valid 2026-07-28 request was refused as a header mismatch (SEP-2243, -32020).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

_OWS = b" \t"


class TrimHeaderValues:
    """ASGI middleware: strips SP and HTAB around every request header value (the rest untouched)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = scope["headers"]
            if any(value[-1:] in (b" ", b"\t") or value[:1] in (b" ", b"\t") for _, value in headers):
                scope = {**scope, "headers": [(name, value.strip(_OWS)) for name, value in headers]}
        await self.app(scope, receive, send)
