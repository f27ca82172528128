"""The console's clients page, for admins: the OAuth clients signed in at Writ's authorization server in
the admin's tenant, each with its live sign-ins, and a button that ends them all (`oauth.client_revoked`,
as `POST /api/oauth/clients/{id}/revoke` does)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from gateway.display import visible
from policy.model import Principal
from store.limits import text_unfit
from store.model import NotFound
from store.oauth_clients import Liveness, RevokeClient
from store.ports import OAuthClients

if TYPE_CHECKING:
    from gateway.console.routes import Console

ADMIN_ROLE = "admin"


class ClientPages:
    def __init__(
        self, console: Console, store: OAuthClients, liveness: Liveness, clock: Callable[[], datetime]
    ) -> None:
        self.console = console
        self.store = store
        self.liveness = liveness
        self.clock = clock

    def routes(self) -> list[BaseRoute]:
        signed_in = self.console.signed_in
        return [
            Route("/console/clients", signed_in(self.show), methods=["GET"]),
            Route("/console/clients/revoke", signed_in(self.revoke), methods=["POST"]),
        ]

    async def show(
        self,
        request: Request,
        who: Principal,
        *,
        error: str | None = None,
        done: str | None = None,
        status_code: int = 200,
    ) -> Response:
        """GET /console/clients: every client signed in in the tenant, with its live sign-ins."""
        if ADMIN_ROLE not in who.roles:
            message = "The clients page needs the admin role."
            return self.console.render(request, "message.html", 403, who=who, message=message)
        now = self.clock()
        live_after = self.liveness.live_after(now)

        clients = await anyio.to_thread.run_sync(
            lambda: self.store.oauth_client_details(tenant=who.tenant, now=now, live_after=live_after)
        )
        return self.console.render(
            request, "clients.html", status_code, who=who, clients=clients, error=error, done=done
        )

    async def revoke(self, request: Request, who: Principal) -> Response:
        """POST /console/clients/revoke: end every sign-in of one client in the tenant."""
        from gateway.console.routes import STALE_FORM

        if ADMIN_ROLE not in who.roles:
            message = "Revoking a client's sign-ins needs the admin role."
            return self.console.render(request, "message.html", 403, who=who, message=message)
        form = await request.form()
        if not self.console.form_ok(request, form):
            return await self.show(request, who, status_code=403, error=STALE_FORM)
        client_id = str(form.get("client_id", ""))
        reason = str(form.get("reason", "")).strip()[:500] or None
        if reason is not None and (why := text_unfit(reason)) is not None:
            return await self.show(request, who, status_code=400, error=f"The reason {why}.")
        command = RevokeClient(client_id, who.tenant, revoked_by=who.subject, now=self.clock(), reason=reason)
        try:
            revoked = await anyio.to_thread.run_sync(self.store.revoke_oauth_client, command)
        except NotFound:
            return await self.show(
                request, who, status_code=404, error="No such client signed anyone in here."
            )
        ended = revoked.sign_ins_ended
        done = f"Ended {ended} sign-in{'s' if ended != 1 else ''} of {visible(client_id)}."
        return await self.show(request, who, done=done)
