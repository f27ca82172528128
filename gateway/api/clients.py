"""`/api/oauth/clients`: the OAuth clients signed in at Writ's authorization server, for admins of the
caller's tenant. GET lists them, GET `/{id}` shows one with its live sign-ins, POST `/{id}/revoke`
ends every sign-in of it in the tenant (`oauth.client_revoked`): its refresh tokens are refused from
then on and its access tokens at once (401 at /mcp). A client id may be a URL (a client known by its
metadata document): it goes in the path as it is, or percent-encoded.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import anyio.to_thread
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.api.guard import Guard, error
from gateway.api.principals import ADMINS
from gateway.reasons import ReasonCode
from policy.model import Principal
from store.limits import text_unfit
from store.model import NotFound
from store.oauth_clients import Liveness, RevokeClient
from store.ports import OAuthClients


class RevokeBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str | None = Field(default=None, max_length=500)


class Clients:
    def __init__(self, store: OAuthClients, clock: Callable[[], datetime], liveness: Liveness) -> None:
        self.store = store
        self.clock = clock
        self.liveness = liveness

    def routes(self, guarded: Guard) -> list[Route]:
        need = "Managing OAuth clients needs the admin role"
        return [
            Route("/api/oauth/clients", guarded(self.list, roles=ADMINS, refusal=need), methods=["GET"]),
            Route(
                "/api/oauth/clients/{client_id:path}/revoke",
                guarded(self.revoke, roles=ADMINS, refusal=need),
                methods=["POST"],
            ),
            Route(
                "/api/oauth/clients/{client_id:path}",
                guarded(self.show, roles=ADMINS, refusal=need),
                methods=["GET"],
            ),
        ]

    async def list(self, request: Request, who: Principal) -> Response:
        now = self.clock()
        clients = await anyio.to_thread.run_sync(
            lambda: self.store.oauth_clients(
                tenant=who.tenant, now=now, live_after=self.liveness.live_after(now)
            )
        )
        return JSONResponse({"tenant": who.tenant, "clients": [c.to_json() for c in clients]})

    async def show(self, request: Request, who: Principal) -> Response:
        client_id = request.path_params["client_id"]
        now = self.clock()
        try:
            detail = await anyio.to_thread.run_sync(
                lambda: self.store.oauth_client(
                    client_id, tenant=who.tenant, now=now, live_after=self.liveness.live_after(now)
                )
            )
        except NotFound as exc:
            return error(ReasonCode.NOT_FOUND, str(exc))
        return JSONResponse(detail.to_json())

    async def revoke(self, request: Request, who: Principal) -> Response:
        try:
            body = RevokeBody.model_validate_json(await request.body() or b"{}")
        except ValidationError as exc:
            return error(ReasonCode.INVALID_REQUEST, "; ".join(e["msg"] for e in exc.errors()))
        if (why := text_unfit(body.reason or "")) is not None:
            return error(ReasonCode.INVALID_REQUEST, f"the reason {why}")
        command = RevokeClient(
            request.path_params["client_id"],
            who.tenant,
            revoked_by=who.subject,
            now=self.clock(),
            reason=body.reason,
        )
        try:
            revoked = await anyio.to_thread.run_sync(self.store.revoke_oauth_client, command)
        except NotFound as exc:
            return error(ReasonCode.NOT_FOUND, str(exc))
        return JSONResponse(revoked.to_json())


def client_routes(
    store: OAuthClients,
    principal_of: Callable[[AuthenticatedUser], Principal],
    resource_metadata_url: str,
    *,
    clock: Callable[[], datetime],
    liveness: Liveness,
) -> list[Route]:
    """The OAuth client routes (see `Clients`)."""
    return Clients(store, clock, liveness).routes(Guard(store, principal_of, resource_metadata_url))
