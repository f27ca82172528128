"""The HTTP edge's bearer authentication: the MCP SDK's backend, plus a reason for a refused claim.

A token that fails its signature, issuer, audience or expiry gets a bare 401 (the reason is logged:
it would help a forger). A token the issuer signed whose claims Writ cannot act on or record (a tenant
over the limit, a subject with NUL) gets 401 with that reason, so whoever configures the issuer learns
what to fix; nothing of it reaches the store.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from mcp.server.auth.middleware.bearer_auth import BearerAuthBackend
from mcp.server.auth.provider import AccessToken
from starlette.authentication import AuthenticationError
from starlette.requests import HTTPConnection
from starlette.responses import JSONResponse, Response

from gateway.auth.tokens import ClaimsRejected, JwtVerifier
from gateway.reasons import ReasonCode

INVALID_CLAIMS = ReasonCode.INVALID_TOKEN


class ClaimsRefused(AuthenticationError):
    """Raised to Starlette's AuthenticationMiddleware, which answers it with `refused_claims`."""


class _ReasonedVerifier:
    """The SDK's `TokenVerifier` over `JwtVerifier`, letting a claims refusal through as an error."""

    def __init__(self, verifier: JwtVerifier) -> None:
        self._verifier = verifier

    async def verify_token(self, token: str) -> AccessToken | None:
        try:
            return await self._verifier.verify_token(token, explain_claims=True)
        except ClaimsRejected as exc:
            raise ClaimsRefused(str(exc)) from exc


def bearer_backend(verifier: JwtVerifier) -> BearerAuthBackend:
    """The authentication backend for every HTTP route."""
    return BearerAuthBackend(_ReasonedVerifier(verifier))


def refused_claims(resource_metadata_url: str) -> Callable[[HTTPConnection, Exception], Response]:
    """The `on_error` of AuthenticationMiddleware: 401 naming the claim and its limit."""

    def on_error(conn: HTTPConnection, exc: Exception) -> Response:
        description = str(exc)
        # A header value cannot hold a quote unescaped, nor anything but printable ASCII.
        quoted = json.dumps(description, ensure_ascii=True)[1:-1].replace('\\"', "'")
        challenge = (
            f'Bearer error="{INVALID_CLAIMS}", error_description="{quoted}", '
            f'resource_metadata="{resource_metadata_url}"'
        )
        return JSONResponse(
            {"error": INVALID_CLAIMS, "error_description": description},
            status_code=401,
            headers={"WWW-Authenticate": challenge},
        )

    return on_error
