"""`/api/runs`: the caller's tenant's runs, one run with its calls and budget use, and the run controls
`POST /api/runs/{id}/stop` and `/resume` (role approver or admin, a reason in the body).

A stop is `run.stopped`: the run's later calls are refused `run_stopped` and its waiting approvals
withdrawn; a resume is `run.resumed`. Runs of another tenant answer exactly like runs that do not exist.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.api.guard import Guard, PrincipalOf, error, invalid_body, refused
from gateway.auth.oversight import OVERSEER_ROLES, may_read
from gateway.calls.runs import (
    MAX_REASON,
    RUN_CONTROL_ROLES,
    RunControl,
    RunDetail,
    resume_run,
    run_detail,
    stop_run,
)
from gateway.clock import Clock
from gateway.errors import Refused
from gateway.mcp.results import status_document
from gateway.reasons import ReasonCode
from policy.model import Principal
from store.model import RunView
from store.ports import RunControls

NEEDS_ROLE = "Stopping or resuming a run needs the approver or admin role"


class RunControlBody(BaseModel):
    """POST /api/runs/{id}/stop or /resume: why (recorded with who)."""

    model_config = ConfigDict(extra="forbid")

    reason: str = Field(min_length=1, max_length=MAX_REASON)


class RunsApi:
    """GET /api/runs, GET /api/runs/{id}, POST /api/runs/{id}/stop and /resume: one method each."""

    def __init__(self, store: RunControls, clock: Clock) -> None:
        self.store = store
        self.clock = clock

    def routes(self, guarded: Guard) -> list[Route]:
        """The routes, each behind `guarded`."""
        return [
            Route(
                "/api/runs",
                guarded(
                    self.list_runs,
                    roles=OVERSEER_ROLES,
                    refusal="Listing runs needs the approver, auditor or admin role",
                ),
                methods=["GET"],
            ),
            Route("/api/runs/{run_id}", guarded(self.get_run), methods=["GET"]),
            Route(
                "/api/runs/{run_id}/stop",
                guarded(self.stop, roles=RUN_CONTROL_ROLES, refusal=NEEDS_ROLE),
                methods=["POST"],
            ),
            Route(
                "/api/runs/{run_id}/resume",
                guarded(self.resume, roles=RUN_CONTROL_ROLES, refusal=NEEDS_ROLE),
                methods=["POST"],
            ),
        ]

    async def list_runs(self, request: Request, who: Principal) -> Response:
        """GET /api/runs[?status=active|stopped]: the tenant's runs, newest first."""
        status = request.query_params.get("status")
        runs = await anyio.to_thread.run_sync(lambda: self.store.list_runs(tenant=who.tenant, status=status))
        return JSONResponse({"runs": [run_json(r) for r in runs]})

    async def get_run(self, request: Request, who: Principal) -> Response:
        """GET /api/runs/{id}: the run, its calls and the budgets they drew on."""
        run_id = request.path_params["run_id"]
        detail = await anyio.to_thread.run_sync(lambda: run_detail(self.store, run_id, who.tenant))
        if detail is None or not may_read(who, detail.run.subject):
            return error(ReasonCode.NOT_FOUND, "No such run")
        return JSONResponse(detail_json(detail))

    async def stop(self, request: Request, who: Principal) -> Response:
        """POST /api/runs/{id}/stop: `run.stopped`; its waiting approvals are withdrawn."""
        return await self._control(request, who, stop_run)

    async def resume(self, request: Request, who: Principal) -> Response:
        """POST /api/runs/{id}/resume: `run.resumed`; it takes calls again."""
        return await self._control(request, who, resume_run)

    async def _control(
        self, request: Request, who: Principal, act: Callable[[RunControls, RunControl], RunView]
    ) -> Response:
        try:
            body = RunControlBody.model_validate_json(await request.body() or b"{}")
        except ValidationError as exc:
            return invalid_body(exc)
        control = RunControl(
            run_id=request.path_params["run_id"],
            by=who.subject,
            reason=body.reason,
            roles=who.roles,
            tenant=who.tenant,
            now=self.clock(),
        )
        try:
            run = await anyio.to_thread.run_sync(lambda: act(self.store, control))
        except Refused as exc:
            return refused(exc)
        return JSONResponse(run_json(run))


def run_routes(
    store: RunControls, principal_of: PrincipalOf, resource_metadata_url: str, *, clock: Clock
) -> list[Route]:
    """The run routes (see `RunsApi`)."""
    return RunsApi(store, clock).routes(Guard(store, principal_of, resource_metadata_url))


def run_json(run: RunView) -> dict[str, Any]:
    """A run as the API and `writ runs` show it."""
    return {
        "runId": run.run_id,
        "tenant": run.tenant,
        "subject": run.subject,
        "origin": run.origin,
        "status": run.status,
        "startedAt": run.started_at.isoformat(),
        "callCount": run.call_count,
        "stoppedAt": run.stopped_at.isoformat() if run.stopped_at else None,
        "stoppedBy": run.stopped_by,
        "stopReason": run.stop_reason,
    }


def detail_json(detail: RunDetail) -> dict[str, Any]:
    """A run with its calls and budget use."""
    calls = [
        status_document(c)
        | {"toolName": c.tool_name, "summary": c.summary, "createdAt": c.created_at.isoformat()}
        for c in detail.calls
    ]
    budgets = [{"budget": b.budget, "calls": b.calls, "amount": b.amount} for b in detail.budgets]
    return run_json(detail.run) | {"calls": calls, "budgets": budgets}
