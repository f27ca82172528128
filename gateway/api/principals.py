"""`/api/principals/{subject}/revocation`: revoke (POST) or restore (DELETE) a subject in the caller's
tenant, role admin, the caller in good standing.

Each is an event (`principal.revoked`, `principal.restored`). While revoked, every power of the subject
is refused: calls and approved-but-not-run calls with reason `principal_revoked`, and every read or
decision on every face (`gateway.auth.standing`). A restore gives back what the token grants, no more.
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
from gateway.clock import Clock
from gateway.reasons import ReasonCode
from policy.model import Principal
from store.commands import RestorePrincipal, RevokePrincipal
from store.limits import SUBJECT_CHARS, refusal, text_unfit
from store.model import NotFound
from store.ports import Revocations
from store.revoking import Revocation

ADMIN_ROLE = "admin"
ADMINS = frozenset({ADMIN_ROLE})


class StandingBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str | None = Field(default=None, max_length=500)


class Principals:
    """POST and DELETE /api/principals/{subject}/revocation, for admins: one method each."""

    def __init__(self, store: Revocations, clock: Callable[[], datetime]) -> None:
        self.store = store
        self.clock = clock

    def routes(self, guarded: Guard) -> list[Route]:
        """The routes, each behind `guarded` and needing the admin role."""
        return [
            Route(
                "/api/principals/{subject}/revocation",
                guarded(self.revoke, roles=ADMINS, refusal="Revoking a principal needs the admin role"),
                methods=["POST"],
            ),
            Route(
                "/api/principals/{subject}/revocation",
                guarded(self.restore, roles=ADMINS, refusal="Restoring a principal needs the admin role"),
                methods=["DELETE"],
            ),
        ]

    async def revoke(self, request: Request, who: Principal) -> Response:
        """Every power of the subject is refused from now on (`principal.revoked`)."""
        body = await _checked(request)
        if isinstance(body, Response):
            return body
        subject = request.path_params["subject"]
        revocation = await anyio.to_thread.run_sync(
            lambda: self.store.revoke_principal(
                RevokePrincipal(
                    who.tenant, subject, revoked_by=who.subject, reason=body.reason, now=self.clock()
                )
            )
        )
        return JSONResponse(_revocation(revocation))

    async def restore(self, request: Request, who: Principal) -> Response:
        """The subject's revocation is lifted (404 `not_revoked` if there is none)."""
        body = await _checked(request)
        if isinstance(body, Response):
            return body
        subject = request.path_params["subject"]
        now = self.clock()
        try:
            lifted = await anyio.to_thread.run_sync(
                lambda: self.store.restore_principal(
                    RestorePrincipal(
                        who.tenant, subject, restored_by=who.subject, reason=body.reason, now=now
                    )
                )
            )
        except NotFound as exc:
            return error(ReasonCode.NOT_REVOKED, str(exc))
        return JSONResponse(
            {
                "tenant": lifted.tenant,
                "subject": lifted.subject,
                "restoredAt": now.isoformat(),
                "restoredBy": who.subject,
                "reason": body.reason,
                "lifted": _revocation(lifted),
            }
        )


def principal_routes(
    store: Revocations,
    principal_of: Callable[[AuthenticatedUser], Principal],
    resource_metadata_url: str,
    *,
    clock: Clock,
) -> list[Route]:
    """The principal standing routes (see `Principals`)."""
    return Principals(store, clock).routes(Guard(store, principal_of, resource_metadata_url))


async def _checked(request: Request) -> StandingBody | Response:
    """The request's body and subject, or the 400 that refuses them."""
    raw = await request.body()
    try:
        body = StandingBody.model_validate_json(raw or b"{}")
    except ValidationError as exc:
        return error(ReasonCode.INVALID_REQUEST, "; ".join(e["msg"] for e in exc.errors()))
    subject = request.path_params["subject"]
    # Each was a database error (a 500) on PostgreSQL, where SQLite recorded it: store.limits.
    if (message := refusal("the subject", subject, SUBJECT_CHARS)) is not None:
        return error(ReasonCode.INVALID_REQUEST, message)
    if (why := text_unfit(body.reason or "")) is not None:
        return error(ReasonCode.INVALID_REQUEST, f"the reason {why}")
    return body


def _revocation(revocation: Revocation) -> dict[str, str | int | None]:
    body: dict[str, str | int | None] = {
        "tenant": revocation.tenant,
        "subject": revocation.subject,
        "revokedAt": revocation.revoked_at.isoformat(),
        "revokedBy": revocation.revoked_by,
        "reason": revocation.reason,
    }
    if revocation.grants_revoked is not None:
        body["signInsEnded"] = revocation.grants_revoked
    return body
