"""The HTTP edge's bearer authentication: the MCP SDK's backend, plus the reason a token is refused.

A token that fails a check gets 401 `invalid_token` whose `error_description` says which kind of
failure it was (expired, not valid yet, another audience, a bad signature, an issuer not trusted here,
revoked, malformed) and nothing of this gateway's keys, URLs or settings; the log has the detail. A
token the issuer signed whose claims Writ cannot act on or record (a tenant over the limit, a subject
with NUL) gets that whole reason, so whoever configures the issuer learns what to fix; nothing of it
reaches the store. A request with no token at all gets the SDK's own 401.

Each refusal is also counted as a `security.auth_failed` of its kind from the client's address
(gateway.audit.security bounds how many are written), naming the issuer and subject only when the
issuer's signature verified.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser, BearerAuthBackend
from mcp.server.auth.provider import AccessToken
from starlette.authentication import AuthCredentials, AuthenticationError
from starlette.requests import HTTPConnection
from starlette.responses import JSONResponse, Response

from gateway.audit.security import NoSecurityEvents, SecurityRefusal, SecuritySink
from gateway.auth.tokens import JwtVerifier, TokenRejected
from gateway.reasons import ReasonCode
from gateway.telemetry import Telemetry

INVALID_TOKEN = ReasonCode.INVALID_TOKEN


class TokenRefused(AuthenticationError):
    """Raised to Starlette's AuthenticationMiddleware, which answers it with `refused_token`."""

    def __init__(self, rejected: TokenRejected) -> None:
        super().__init__(rejected.public)
        self.rejected = rejected


class _ReasonedVerifier:
    """The SDK's `TokenVerifier` over `JwtVerifier`, letting a refusal through with its public reason."""

    def __init__(self, verifier: JwtVerifier, telemetry: Telemetry) -> None:
        self._verifier = verifier
        self._telemetry = telemetry

    async def verify_token(self, token: str) -> AccessToken | None:
        try:
            return await self._verifier.verify_token(token, explain=True)
        except TokenRejected as exc:
            self._telemetry.authentication_failed(exc.kind)
            raise TokenRefused(exc) from exc


class _NotedBackend(BearerAuthBackend):
    """The SDK's backend, noting each refused token as a security event from the client's address."""

    def __init__(self, verifier: _ReasonedVerifier, security: SecuritySink) -> None:
        super().__init__(verifier)
        self._security = security

    async def authenticate(self, conn: HTTPConnection) -> tuple[AuthCredentials, AuthenticatedUser] | None:
        try:
            found: tuple[AuthCredentials, AuthenticatedUser] | None = await super().authenticate(conn)
        except TokenRefused as exc:
            claimed = exc.rejected.claimed
            self._security.note(
                SecurityRefusal(
                    "security.auth_failed",
                    exc.rejected.kind,
                    source=conn.client.host if conn.client else None,
                    tenant=claimed.tenant if claimed else None,
                    issuer=claimed.issuer if claimed else None,
                    subject=claimed.subject if claimed else None,
                )
            )
            raise
        return found


def bearer_backend(
    verifier: JwtVerifier, telemetry: Telemetry | None = None, security: SecuritySink | None = None
) -> BearerAuthBackend:
    """The authentication backend for every HTTP route; refusals are counted in `telemetry` and
    noted in `security`."""
    return _NotedBackend(
        _ReasonedVerifier(verifier, telemetry or Telemetry()), security or NoSecurityEvents()
    )


def refused_token(resource_metadata_url: str) -> Callable[[HTTPConnection, Exception], Response]:
    """The `on_error` of AuthenticationMiddleware: 401 saying why the token was refused."""

    def on_error(conn: HTTPConnection, exc: Exception) -> Response:
        description = str(exc)
        # A header value cannot hold a quote unescaped, nor anything but printable ASCII.
        quoted = json.dumps(description, ensure_ascii=True)[1:-1].replace('\\"', "'")
        challenge = (
            f'Bearer error="{INVALID_TOKEN}", error_description="{quoted}", '
            f'resource_metadata="{resource_metadata_url}"'
        )
        return JSONResponse(
            {"error": INVALID_TOKEN, "error_description": description},
            status_code=401,
            headers={"WWW-Authenticate": challenge},
        )

    return on_error
