"""`POST /api/principals/{subject}/revocation`: revoke a subject in the caller's tenant (role admin).

The revocation is an event (`principal.revoked`); from then on the pipeline refuses the subject's calls
and the resume worker refuses their approved ones, each with reason `principal_revoked`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import anyio.to_thread
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.api import _error
from policy.model import Principal
from store.limits import SUBJECT_CHARS, refusal, text_unfit
from store.store import Store

ADMIN_ROLE = "admin"


class RevocationBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str | None = Field(default=None, max_length=500)


def principal_routes(
    store: Store,
    principal_of: Callable[[AuthenticatedUser], Principal],
    resource_metadata_url: str,
    *,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> list[Route]:
    async def revoke(request: Request) -> Response:
        user = request.scope.get("user")
        if not isinstance(user, AuthenticatedUser):
            return _error(
                401, "invalid_token", "Authentication required", resource_metadata=resource_metadata_url
            )
        who = principal_of(user)
        if ADMIN_ROLE not in who.roles:
            return _error(403, "insufficient_role", "Revoking a principal needs the admin role")
        raw = await request.body()
        try:
            body = RevocationBody.model_validate_json(raw or b"{}")
        except ValidationError as exc:
            return _error(400, "invalid_request", "; ".join(e["msg"] for e in exc.errors()))
        subject = request.path_params["subject"]
        # Each was a database error (a 500) on PostgreSQL, where SQLite recorded it: store.limits.
        if (message := refusal("the subject", subject, SUBJECT_CHARS)) is not None:
            return _error(400, "invalid_request", message)
        if (why := text_unfit(body.reason or "")) is not None:
            return _error(400, "invalid_request", f"the reason {why}")
        revocation = await anyio.to_thread.run_sync(
            lambda: store.revoke_principal(
                who.tenant, subject, revoked_by=who.subject, reason=body.reason, now=clock()
            )
        )
        return JSONResponse(
            {
                "tenant": revocation.tenant,
                "subject": revocation.subject,
                "revokedAt": revocation.revoked_at.isoformat(),
                "revokedBy": revocation.revoked_by,
                "reason": revocation.reason,
            }
        )

    return [Route("/api/principals/{subject}/revocation", revoke, methods=["POST"])]
