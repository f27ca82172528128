"""The HTTP API: calls, runs and approvals for people and programs with the right role; decisions.

Every route is tenant-scoped: a principal never sees another tenant's records, and an id from another
tenant answers exactly like an id that does not exist.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from typing import Any, Literal

import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.api.audit import AuditEvents
from gateway.api.guard import Guard, PrincipalOf, error, invalid_body, refused
from gateway.auth.oversight import OVERSEER_ROLES, may_read
from gateway.calls.approvals import DecisionInput, Decisions
from gateway.calls.resolutions import RESOLVER_ROLES, ResolutionInput, resolve_call
from gateway.calls.retries import retry_links
from gateway.calls.run_ids import scoped_run_id
from gateway.clock import Clock
from gateway.errors import Refused
from gateway.mcp.results import recorded_decision, status_document, unknown_detail
from gateway.reasons import ReasonCode
from policy.model import Principal
from store.model import StoredEvent
from store.ports import Oversight


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


class Api:
    """The /api handlers, one method per route; `Guard` checks token, standing and role first."""

    def __init__(self, store: Oversight, clock: Clock, decisions: Decisions | None = None) -> None:
        self.store = store
        self.clock = clock
        self.decisions = decisions

    def routes(self, guarded: Guard) -> list[Route]:
        """The routes, each behind `guarded`."""
        routes = [
            Route("/api/calls/{tool_call_id}", guarded(self.get_call), methods=["GET"]),
            Route(
                "/api/calls/{tool_call_id}/resolution",
                guarded(
                    self.resolve,
                    roles=RESOLVER_ROLES,
                    refusal="Resolving a call needs the approver or admin role",
                ),
                methods=["POST"],
            ),
            Route("/api/runs/{run_id}/events", guarded(self.run_events), methods=["GET"]),
            Route(
                "/api/approvals",
                guarded(
                    self.list_approvals,
                    roles=OVERSEER_ROLES,
                    refusal="Listing approvals needs the approver, auditor or admin role",
                ),
                methods=["GET"],
            ),
            Route("/api/approvals/{approval_id}", guarded(self.get_approval), methods=["GET"]),
        ]
        if self.decisions is not None:
            routes.append(
                Route("/api/approvals/{approval_id}/decision", guarded(self.decide), methods=["POST"])
            )
        return routes

    async def get_call(self, request: Request, who: Principal) -> Response:
        """GET /api/calls/{id}: the call's status document and what it was asked to do."""
        tool_call_id = request.path_params["tool_call_id"]
        call = await anyio.to_thread.run_sync(lambda: self.store.get_call(tool_call_id, tenant=who.tenant))
        if call is None or not may_read(who, call.subject):
            return error(ReasonCode.NOT_FOUND, "No such tool call")
        events = await anyio.to_thread.run_sync(lambda: self.store.events(tool_call_id=tool_call_id))
        decision = recorded_decision(events)
        detail = unknown_detail(events)
        body = status_document(call, include_result=True, decision=decision, detail=detail)
        body |= retry_links(events)
        body.update(
            runId=call.run_id,
            subject=call.subject,
            tenant=call.tenant,
            arguments=dict(call.arguments),
            idempotencyKey=call.idempotency_key,
            backendKey=call.sent_key if call.attempts else None,
            actionHash=call.action_hash,
            policyVersion=call.policy_version,
            decision=call.decision_effect,
            reason=call.reason,
        )
        return JSONResponse(_json(body))

    async def run_events(self, request: Request, who: Principal) -> Response:
        """GET /api/runs/{id}/events: a run's events, by the caller's run name or Writ's id."""
        named = request.path_params["run_id"]

        def read() -> tuple[str, list[StoredEvent]]:
            # The caller's own run of that name (the writ/runId its client sent) first, then Writ's id.
            own = scoped_run_id(who, named)
            found = self.store.events(run_id=own, tenant=who.tenant)
            return (own, found) if found else (named, self.store.events(run_id=named, tenant=who.tenant))

        run_id, events = await anyio.to_thread.run_sync(read)
        if not events or not may_read(who, _run_subject(events)):
            return error(ReasonCode.NOT_FOUND, "No such run")
        return JSONResponse({"runId": run_id, "events": [_json(asdict(e)) for e in events]})

    async def list_approvals(self, request: Request, who: Principal) -> Response:
        """GET /api/approvals[?status=]: the tenant's approvals, for overseers."""
        status = request.query_params.get("status")
        approvals = await anyio.to_thread.run_sync(
            lambda: self.store.list_approvals(tenant=who.tenant, status=status)
        )
        return JSONResponse({"approvals": [_json(asdict(a)) for a in approvals]})

    async def get_approval(self, request: Request, who: Principal) -> Response:
        """GET /api/approvals/{id}."""
        approval_id = request.path_params["approval_id"]
        approval = await anyio.to_thread.run_sync(
            lambda: self.store.get_approval(approval_id, tenant=who.tenant)
        )
        if approval is None or not may_read(who, approval.requester):
            return error(ReasonCode.NOT_FOUND, "No such approval")
        return JSONResponse(_json(asdict(approval)))

    async def decide(self, request: Request, who: Principal) -> Response:
        """POST /api/approvals/{id}/decision: only appends the decision; the resume worker runs it."""
        assert self.decisions is not None
        try:
            body = DecisionBody.model_validate_json(await request.body())
        except ValidationError as exc:
            return invalid_body(exc)
        try:
            approval = await self.decisions.decide(
                DecisionInput(
                    approval_id=request.path_params["approval_id"],
                    approve=body.decision == "approve",
                    decided_by=who.subject,
                    reason=body.reason,
                    roles=who.roles,
                    tenant=who.tenant,
                )
            )
        except Refused as exc:
            return refused(exc)
        return JSONResponse(_json(asdict(approval)))

    async def resolve(self, request: Request, who: Principal) -> Response:
        """POST /api/calls/{id}/resolution: a person settles an unknown outcome."""
        try:
            body = ResolutionBody.model_validate_json(await request.body())
        except ValidationError as exc:
            return invalid_body(exc)
        resolution = ResolutionInput(
            tool_call_id=request.path_params["tool_call_id"],
            succeeded=body.outcome == "succeeded",
            evidence=body.evidence,
            resolved_by=who.subject,
            roles=who.roles,
            tenant=who.tenant,
        )
        try:
            call = await resolve_call(self.store, resolution, self.clock())
        except Refused as exc:
            return refused(exc)
        body_out = status_document(call, include_result=True) | {"resolvedBy": call.resolved_by}
        return JSONResponse(_json(body_out))


def api_routes(
    store: Oversight,
    principal_of: PrincipalOf,
    resource_metadata_url: str,
    decisions: Decisions | None = None,
    *,
    clock: Clock,
) -> list[Route]:
    """Routes under /api, each requiring a verified bearer token of a principal in good standing."""
    guarded = Guard(store, principal_of, resource_metadata_url)
    return [*Api(store, clock, decisions).routes(guarded), AuditEvents(store).route(guarded)]


def _run_subject(events: list[StoredEvent]) -> str | None:
    for event in events:
        if event.type == "run.started":
            subject = event.payload.get("subject")
            return subject if isinstance(subject, str) else None
    return None
