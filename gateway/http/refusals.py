"""Refusals at the HTTP edge noted as `security.edge_refused` events, by the status they were answered.

Whatever refuses a request before it reaches Writ's handlers answers with its own status: 413 for a
body over the limit (`BodyLimit`, the MCP SDK's own bound on /mcp), 408 for a body that did not arrive
in time (`BodyDeadline`), 421 and 403 from the MCP SDK's DNS-rebinding check on /mcp (a Host or an
Origin this gateway does not serve), 429 for a rate limit at the HTTP face (client registration).
This middleware sits outside all of them and reads only the status line of the answer, so it needs
no hook in each; a 403 with a `WWW-Authenticate` challenge is a scope refusal, not an edge one.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.audit.security import SecurityRefusal, SecuritySink, shown

_KINDS = {413: "request_too_large", 408: "request_timeout", 421: "bad_host", 429: "rate_limited"}


def refusal_kind(path: str, status: int, headers: list[tuple[bytes, bytes]]) -> str | None:
    """The kind of edge refusal an answer of `status` on `path` is, or None when it is not one."""
    if status in _KINDS:
        return _KINDS[status]
    on_mcp = path == "/mcp" or path.startswith("/mcp/")
    challenged = any(name.lower() == b"www-authenticate" for name, _ in headers)
    return "bad_origin" if status == 403 and on_mcp and not challenged else None


class EdgeRefusals:
    """ASGI middleware: each answer of a status above is noted as a refusal from the client's address."""

    def __init__(self, app: ASGIApp, security: SecuritySink) -> None:
        self.app = app
        self.security = security

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def watched(message: Message) -> None:
            if message["type"] == "http.response.start":
                path = scope.get("path", "")
                kind = refusal_kind(path, message["status"], list(message.get("headers", [])))
                if kind is not None:
                    client = scope.get("client")
                    self.security.note(
                        SecurityRefusal(
                            "security.edge_refused",
                            kind,
                            source=client[0] if client else None,
                            path=shown(path),
                        )
                    )
            await send(message)

        await self.app(scope, receive, watched)
