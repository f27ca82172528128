"""The one guard of every /api route: a verified bearer token, a principal in good standing, a role.

The token was verified by the authentication middleware (`gateway.http.bearer`); this asks the store
for the principal's standing, since a token still verifies after a revocation (it is not ours to
recall), and checks the role a route needs before its handler runs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Set

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.auth.standing import is_revoked, revoked_text
from gateway.errors import Refused
from gateway.reasons import ReasonCode, http_status
from policy.model import Principal
from store.ports import Standing

PrincipalOf = Callable[[AuthenticatedUser], Principal]
Handler = Callable[[Request, Principal], Awaitable[Response]]
Endpoint = Callable[[Request], Awaitable[Response]]


def error(code: ReasonCode | str, description: str, *, resource_metadata: str | None = None) -> Response:
    """An OAuth-style error body with the code's HTTP status; a 401 also carries the challenge."""
    status = http_status(code)
    headers = {}
    if status == 401:
        challenge = f'Bearer error="{code}", error_description="{description}"'
        if resource_metadata:
            challenge += f', resource_metadata="{resource_metadata}"'
        headers["WWW-Authenticate"] = challenge
    return JSONResponse(
        {"error": code, "error_description": description}, status_code=status, headers=headers
    )


def invalid_body(exc: ValidationError) -> Response:
    """The API's answer to a body its model refused: `invalid_request`, naming each field and why."""
    detail = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors())
    return error(ReasonCode.INVALID_REQUEST, detail)


def refused(exc: Refused) -> Response:
    """The API's answer to a refusal: its code's HTTP status, the code, and the sentence."""
    return error(exc.code, str(exc))


class Guard:
    """Wraps a handler so it runs only for a verified principal in good standing with the role."""

    def __init__(self, store: Standing, principal_of: PrincipalOf, resource_metadata_url: str) -> None:
        self.store = store
        self.principal_of = principal_of
        self.resource_metadata_url = resource_metadata_url

    def __call__(self, handler: Handler, *, roles: Set[str] = frozenset(), refusal: str = "") -> Endpoint:
        """`handler` behind the guard; with `roles`, one of them is needed, else 403 with `refusal`."""

        async def endpoint(request: Request) -> Response:
            who = await self.principal(request)
            if isinstance(who, Response):
                return who
            if roles and not who.roles & roles:
                return error(ReasonCode.INSUFFICIENT_ROLE, refusal)
            return await handler(request, who)

        return endpoint

    async def principal(self, request: Request) -> Principal | Response:
        """The request's principal, or the 401 or 403 that refuses it."""
        user = request.scope.get("user")
        if not isinstance(user, AuthenticatedUser):
            return error(
                ReasonCode.INVALID_TOKEN,
                "Authentication required",
                resource_metadata=self.resource_metadata_url,
            )
        who = self.principal_of(user)
        if await is_revoked(self.store, who):
            return error(ReasonCode.PRINCIPAL_REVOKED, revoked_text(who))
        return who
