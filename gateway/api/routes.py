"""The HTTP API: calls, runs and approvals for people and programs with the right role; decisions.

Every route is tenant-scoped: a principal never sees another tenant's records, and an id from another
tenant answers exactly like an id that does not exist.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any, Literal

import anyio.to_thread
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.auth.oversight import OVERSEER_ROLES, may_read
from gateway.auth.standing import REVOKED, is_revoked, revoked_text
from gateway.calls.approvals import DecisionInput, DecisionRefused, Decisions
from gateway.calls.resolutions import RESOLVER_ROLES, ResolutionInput, ResolutionRefused, resolve_call
from gateway.calls.run_ids import scoped_run_id
from gateway.mcp.results import status_document
from policy.model import Principal
from store.model import StoredEvent
from store.ports import Oversight, Standing

PrincipalOf = Callable[[AuthenticatedUser], Principal]


class DecisionBody(BaseModel):
    """POST /api/approvals/{id}/decision."""

    model_config = ConfigDict(extra="forbid")

    decision: Literal["approve", "reject"]
    reason: str | None = Field(default=None, max_length=2000)


class ResolutionBody(BaseModel):
    """POST /api/calls/{id}/resolution: a person settles an unknown outcome with evidence."""

    model_config = ConfigDict(extra="forbid")

    outcome: Literal["succeeded", "failed"]
    evidence: str = Field(min_length=1, max_length=4000)


def _json(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json(v) for v in value]
    return value


def _error(status: int, error: str, description: str, *, resource_metadata: str | None = None) -> Response:
    headers = {}
    if status == 401:
        challenge = f'Bearer error="{error}", error_description="{description}"'
        if resource_metadata:
            challenge += f', resource_metadata="{resource_metadata}"'
        headers["WWW-Authenticate"] = challenge
    return JSONResponse(
        {"error": error, "error_description": description}, status_code=status, headers=headers
    )


Handler = Callable[[Request, Principal], Awaitable[Response]]


def guard(
    store: Standing, principal_of: PrincipalOf, resource_metadata_url: str
) -> Callable[[Handler], Callable[[Request], Awaitable[Response]]]:
    """Wrap a handler so it runs only for a verified token whose principal is in good standing."""

    def guarded(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            user = request.scope.get("user")
            if not isinstance(user, AuthenticatedUser):
                return _error(
                    401, "invalid_token", "Authentication required", resource_metadata=resource_metadata_url
                )
            who = principal_of(user)
            # The token still verifies after a revocation (it is not ours to recall): the store says.
            if await is_revoked(store, who):
                return _error(403, REVOKED, revoked_text(who))
            return await handler(request, who)

        return endpoint

    return guarded


def api_routes(
    store: Oversight,
    principal_of: PrincipalOf,
    resource_metadata_url: str,
    decisions: Decisions | None = None,
) -> list[Route]:
    """Routes under /api, each requiring a verified bearer token of a principal in good standing."""
    guarded = guard(store, principal_of, resource_metadata_url)

    async def get_call(request: Request, who: Principal) -> Response:
        call = await anyio.to_thread.run_sync(
            lambda: store.get_call(request.path_params["tool_call_id"], tenant=who.tenant)
        )
        if call is None or not may_read(who, call.subject):
            return _error(404, "not_found", "No such tool call")
        body = status_document(call, include_result=True)
        body.update(
            runId=call.run_id,
            subject=call.subject,
            tenant=call.tenant,
            arguments=dict(call.arguments),
            idempotencyKey=call.idempotency_key,
            actionHash=call.action_hash,
            policyVersion=call.policy_version,
            decision=call.decision_effect,
            reason=call.reason,
        )
        return JSONResponse(_json(body))

    async def run_events(request: Request, who: Principal) -> Response:
        named = request.path_params["run_id"]

        def read() -> tuple[str, list[StoredEvent]]:
            # The caller's own run of that name (the writ/runId its client sent) first, then Writ's id.
            own = scoped_run_id(who, named)
            found = store.events(run_id=own, tenant=who.tenant)
            return (own, found) if found else (named, store.events(run_id=named, tenant=who.tenant))

        run_id, events = await anyio.to_thread.run_sync(read)
        if not events or not may_read(who, _run_subject(events)):
            return _error(404, "not_found", "No such run")
        return JSONResponse({"runId": run_id, "events": [_json(asdict(e)) for e in events]})

    async def list_approvals(request: Request, who: Principal) -> Response:
        if not who.roles & OVERSEER_ROLES:
            return _error(
                403, "insufficient_role", "Listing approvals needs the approver, auditor or admin role"
            )
        status = request.query_params.get("status")
        approvals = await anyio.to_thread.run_sync(
            lambda: store.list_approvals(tenant=who.tenant, status=status)
        )
        return JSONResponse({"approvals": [_json(asdict(a)) for a in approvals]})

    async def get_approval(request: Request, who: Principal) -> Response:
        approval = await anyio.to_thread.run_sync(
            lambda: store.get_approval(request.path_params["approval_id"], tenant=who.tenant)
        )
        if approval is None or not may_read(who, approval.requester):
            return _error(404, "not_found", "No such approval")
        return JSONResponse(_json(asdict(approval)))

    async def decide(request: Request, who: Principal) -> Response:
        # Deciding only appends the decision; the runtime's resume worker executes an approved call.
        assert decisions is not None
        try:
            body = DecisionBody.model_validate_json(await request.body())
        except ValidationError as exc:
            detail = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors())
            return _error(400, "invalid_request", detail)
        try:
            approval = await decisions.decide(
                DecisionInput(
                    approval_id=request.path_params["approval_id"],
                    approve=body.decision == "approve",
                    decided_by=who.subject,
                    reason=body.reason,
                    roles=who.roles,
                    tenant=who.tenant,
                )
            )
        except DecisionRefused as exc:
            return _error(exc.http_status, exc.code, str(exc))
        return JSONResponse(_json(asdict(approval)))

    async def resolve(request: Request, who: Principal) -> Response:
        if not who.roles & RESOLVER_ROLES:
            return _error(403, "insufficient_role", "Resolving a call needs the approver or admin role")
        try:
            body = ResolutionBody.model_validate_json(await request.body())
        except ValidationError as exc:
            detail = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors())
            return _error(400, "invalid_request", detail)
        resolution = ResolutionInput(
            tool_call_id=request.path_params["tool_call_id"],
            succeeded=body.outcome == "succeeded",
            evidence=body.evidence,
            resolved_by=who.subject,
            roles=who.roles,
            tenant=who.tenant,
        )
        try:
            call = await resolve_call(store, resolution, datetime.now(UTC))
        except ResolutionRefused as exc:
            return _error(exc.http_status, exc.code, str(exc))
        body_out = status_document(call, include_result=True) | {"resolvedBy": call.resolved_by}
        return JSONResponse(_json(body_out))

    routes = [
        Route("/api/calls/{tool_call_id}", guarded(get_call), methods=["GET"]),
        Route("/api/calls/{tool_call_id}/resolution", guarded(resolve), methods=["POST"]),
        Route("/api/runs/{run_id}/events", guarded(run_events), methods=["GET"]),
        Route("/api/approvals", guarded(list_approvals), methods=["GET"]),
        Route("/api/approvals/{approval_id}", guarded(get_approval), methods=["GET"]),
    ]
    if decisions is not None:
        routes.append(Route("/api/approvals/{approval_id}/decision", guarded(decide), methods=["POST"]))
    return routes


def _run_subject(events: list[StoredEvent]) -> str | None:
    for event in events:
        if event.type == "run.started":
            subject = event.payload.get("subject")
            return subject if isinstance(subject, str) else None
    return None
