"""The console's runs pages: the tenant's runs, one run's calls and budget use, and its stop and resume
buttons (role approver or admin), through the one run-control service the API and CLI use."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from gateway.auth.oversight import OVERSEER_ROLES, may_read
from gateway.calls.runs import RUN_CONTROL_ROLES, RunControl, resume_run, run_detail, stop_run
from gateway.clock import Clock
from gateway.errors import Refused
from gateway.mcp.results import outcome_text
from policy.model import Principal
from store.model import RunView
from store.ports import RunControls

if TYPE_CHECKING:
    from gateway.console.routes import Console


class RunPages:
    """GET /console/runs, GET /console/runs/{id}, POST /console/runs/{id}/stop and /resume."""

    def __init__(self, console: Console, store: RunControls, clock: Clock) -> None:
        self.console = console
        self.store = store
        self.clock = clock

    def routes(self) -> list[BaseRoute]:
        signed_in = self.console.signed_in
        return [
            Route("/console/runs", signed_in(self.list_runs), methods=["GET"]),
            Route("/console/runs/{run_id}", signed_in(self.run), methods=["GET"]),
            Route("/console/runs/{run_id}/stop", signed_in(self.stop), methods=["POST"]),
            Route("/console/runs/{run_id}/resume", signed_in(self.resume), methods=["POST"]),
        ]

    async def list_runs(self, request: Request, who: Principal) -> Response:
        """The tenant's runs, newest first, stopped ones marked, for overseers."""
        if not who.roles & OVERSEER_ROLES:
            message = "The runs page needs the approver, auditor or admin role."
            return self.console.render(request, "message.html", 403, who=who, message=message)
        runs = await anyio.to_thread.run_sync(lambda: self.store.list_runs(tenant=who.tenant))
        return self.console.render(request, "runs.html", who=who, runs=runs)

    async def run(self, request: Request, who: Principal) -> Response:
        return await self.show(request, who, request.path_params["run_id"])

    async def show(
        self,
        request: Request,
        who: Principal,
        run_id: str,
        *,
        error: str | None = None,
        status_code: int = 200,
    ) -> Response:
        """One run: its state, its calls with what Writ knows of each, the budgets they drew on."""
        detail = await anyio.to_thread.run_sync(lambda: run_detail(self.store, run_id, who.tenant))
        if detail is None or not may_read(who, detail.run.subject):
            return self.console.render(request, "message.html", 404, who=who, message="No such run.")
        calls = [(c, outcome_text(c)) for c in detail.calls]
        return self.console.render(
            request,
            "run.html",
            status_code,
            who=who,
            run=detail.run,
            calls=calls,
            budgets=detail.budgets,
            may_control=bool(who.roles & RUN_CONTROL_ROLES),
            error=error,
        )

    async def stop(self, request: Request, who: Principal) -> Response:
        return await self._control(request, who, stop_run)

    async def resume(self, request: Request, who: Principal) -> Response:
        return await self._control(request, who, resume_run)

    async def _control(
        self, request: Request, who: Principal, act: Callable[[RunControls, RunControl], RunView]
    ) -> Response:
        from gateway.console.routes import STALE_FORM, refused_text

        run_id = request.path_params["run_id"]
        form = await request.form()
        if not self.console.form_ok(request, form):
            return await self.show(request, who, run_id, status_code=403, error=STALE_FORM)
        control = RunControl(
            run_id=run_id,
            by=who.subject,
            reason=str(form.get("reason", ""))[:4000],
            roles=who.roles,
            tenant=who.tenant,
            now=self.clock(),
        )
        try:
            await anyio.to_thread.run_sync(lambda: act(self.store, control))
        except Refused as exc:
            return await self.show(request, who, run_id, status_code=exc.http_status, error=refused_text(exc))
        return RedirectResponse(f"/console/runs/{run_id}", status_code=303)
