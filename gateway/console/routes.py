"""The console's routes: login, inbox, one approval, its decision, a call's timeline, unresolved calls."""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio.to_thread
from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from gateway.auth.oversight import OVERSEER_ROLES, may_read
from gateway.auth.standing import is_revoked, revoked_text
from gateway.calls.approvals import DecisionInput, DecisionRefused, Decisions
from gateway.calls.resolutions import RESOLVER_ROLES, ResolutionInput, ResolutionRefused, resolve_call
from gateway.console.views import InForce, approval_card, timeline, unresolved_card
from gateway.display import visible
from gateway.mcp.results import outcome_text
from policy.model import Principal
from store.model import TERMINAL_STATUSES
from store.ports import Oversight

HERE = Path(__file__).parent
SESSION_COOKIE = "writ_session"
CSRF_COOKIE = "writ_csrf"

TokenVerifier = Callable[[str], Awaitable[Principal | None]]
"""A bearer token to its principal, or None when it does not verify (the same check as /mcp)."""

REFUSAL_TEXT = {
    "not_found": "No such approval.",
    "not_approver": "You do not hold the role this approval needs.",
    "self_approval_forbidden": "You requested this call; the policy does not let you approve it yourself.",
    "already_decided": "This approval was already decided; nothing was changed.",
    "expired": "This approval expired before it was decided; nothing was changed.",
    "invalid_request": "The reason cannot contain NUL characters; nothing was changed.",
}


def console_routes(
    *,
    store: Oversight,
    decisions: Decisions,
    verify: TokenVerifier,
    secure_cookies: bool = False,
    in_force: InForce | None = None,
) -> list[BaseRoute]:
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    # Every value a page prints, argument or summary or name, shows hidden characters as code points.
    templates.env.finalize = _shown

    def render(request: Request, name: str, status_code: int = 200, **context: Any) -> Response:
        context.setdefault("csrf", request.cookies.get(CSRF_COOKIE, ""))
        context.setdefault("who", None)
        response = templates.TemplateResponse(request, name, context, status_code=status_code)
        response.headers["Cache-Control"] = "no-store"
        response.headers["X-Frame-Options"] = "DENY"
        response.headers["Content-Security-Policy"] = (
            "default-src 'self'; frame-ancestors 'none'; form-action 'self'"
        )
        return response

    async def session(request: Request) -> Principal | None:
        # Every page and form asks the store, not only the login: a session opened before a
        # revocation ends with it (back to the login page, where logging in again says why).
        token = request.cookies.get(SESSION_COOKIE)
        who = await verify(token) if token else None
        return None if who is None or await is_revoked(store, who) else who

    def csrf_ok(request: Request, form: Any) -> bool:
        expected = request.cookies.get(CSRF_COOKIE, "")
        given = str(form.get("csrf", ""))
        return bool(expected) and hmac.compare_digest(expected.encode(), given.encode())

    def to_login() -> Response:
        return RedirectResponse("/console/login", status_code=303)

    async def index(request: Request) -> Response:
        return RedirectResponse("/console/inbox" if await session(request) else "/console/login", 303)

    async def login_form(request: Request) -> Response:
        return render(request, "login.html")

    async def login(request: Request) -> Response:
        # The login form has no CSRF token (there is no session yet): another site could post its own
        # token here and have the approver's browser work, unknowingly, in that session. Browsers say
        # where a request comes from; one from another site is refused.
        if request.headers.get("sec-fetch-site") == "cross-site":
            return render(request, "login.html", 403, error="Log in from this page, not from another site.")
        form = await request.form()
        token = str(form.get("token", "")).strip()
        if token.lower().startswith("bearer "):
            token = token[7:].strip()
        who = await verify(token) if token else None
        if who is None:
            return render(request, "login.html", 401, error="That token did not verify. Paste a valid token.")
        if await is_revoked(store, who):
            return render(request, "login.html", 403, error=f"Refused: {revoked_text(who)}.")
        response = RedirectResponse("/console/inbox", status_code=303)
        for name, value in ((SESSION_COOKIE, token), (CSRF_COOKIE, secrets.token_urlsafe(32))):
            response.set_cookie(
                name, value, httponly=True, samesite="strict", secure=secure_cookies, path="/console"
            )
        return response

    async def logout(request: Request) -> Response:
        form = await request.form()
        if not csrf_ok(request, form):
            return render(request, "message.html", 403, message="The form was stale; log out again.")
        response = to_login()
        response.delete_cookie(SESSION_COOKIE, path="/console")
        response.delete_cookie(CSRF_COOKIE, path="/console")
        return response

    async def inbox(request: Request) -> Response:
        who = await session(request)
        if who is None:
            return to_login()
        if not who.roles & OVERSEER_ROLES:
            return render(
                request,
                "message.html",
                403,
                who=who,
                message="The approval inbox needs the approver, auditor or admin role.",
            )
        now = datetime.now(UTC)

        def load() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
            pending = store.list_approvals(tenant=who.tenant, status="awaiting_approval")
            decided = [a for a in store.list_approvals(tenant=who.tenant) if a.status != "awaiting_approval"]
            cards = [approval_card(store, a, who, now, in_force) for a in pending]
            return cards, [approval_card(store, a, who, now) for a in decided[-20:][::-1]]

        pending, decided = await anyio.to_thread.run_sync(load)
        return render(request, "inbox.html", who=who, pending=pending, decided=decided)

    async def approval(request: Request) -> Response:
        who = await session(request)
        if who is None:
            return to_login()
        return await show_approval(request, who, request.path_params["approval_id"])

    async def show_approval(
        request: Request,
        who: Principal,
        approval_id: str,
        *,
        error: str | None = None,
        status_code: int = 200,
    ) -> Response:
        found = await anyio.to_thread.run_sync(lambda: store.get_approval(approval_id, tenant=who.tenant))
        if found is None or not may_read(who, found.requester):
            return render(request, "message.html", 404, who=who, message="No such approval.")
        card = await anyio.to_thread.run_sync(
            lambda: approval_card(store, found, who, datetime.now(UTC), in_force)
        )
        return render(request, "approval.html", status_code, who=who, card=card, error=error)

    async def decide(request: Request) -> Response:
        who = await session(request)
        if who is None:
            return to_login()
        approval_id = request.path_params["approval_id"]
        form = await request.form()
        if not csrf_ok(request, form):
            return await show_approval(
                request,
                who,
                approval_id,
                status_code=403,
                error="This form is stale or did not come from this console; reload the page and try again.",
            )
        choice = str(form.get("decision", ""))
        if choice not in ("approve", "reject"):
            return await show_approval(
                request, who, approval_id, status_code=400, error="Choose approve or reject."
            )
        reason = str(form.get("reason", "")).strip()[:2000] or None
        try:
            decided = await decisions.decide(
                DecisionInput(
                    approval_id=approval_id,
                    approve=choice == "approve",
                    decided_by=who.subject,
                    reason=reason,
                    roles=who.roles,
                    tenant=who.tenant,
                )
            )
        except DecisionRefused as exc:
            return await show_approval(
                request,
                who,
                approval_id,
                status_code=exc.http_status,
                error=f"Refused ({exc.code}): {REFUSAL_TEXT[exc.code]}",
            )
        return RedirectResponse(f"/console/calls/{decided.tool_call_id}", status_code=303)

    async def unresolved(request: Request) -> Response:
        who = await session(request)
        if who is None:
            return to_login()
        return await show_unresolved(request, who)

    async def show_unresolved(
        request: Request, who: Principal, *, error: str | None = None, status_code: int = 200
    ) -> Response:
        if not who.roles & RESOLVER_ROLES:
            return render(
                request,
                "message.html",
                403,
                who=who,
                message="Resolving calls needs the approver or admin role.",
            )

        def load() -> list[dict[str, Any]]:
            calls = store.list_calls(tenant=who.tenant, unresolved=True)
            return [unresolved_card(store, c) for c in calls]

        cards = await anyio.to_thread.run_sync(load)
        return render(request, "unresolved.html", status_code, who=who, cards=cards, error=error)

    async def resolve(request: Request) -> Response:
        who = await session(request)
        if who is None:
            return to_login()
        form = await request.form()
        if not csrf_ok(request, form):
            return await show_unresolved(
                request,
                who,
                status_code=403,
                error="This form is stale or did not come from this console; reload the page and try again.",
            )
        outcome = str(form.get("outcome", ""))
        if outcome not in ("succeeded", "failed"):
            return await show_unresolved(request, who, status_code=400, error="Choose succeeded or failed.")
        resolution = ResolutionInput(
            tool_call_id=request.path_params["tool_call_id"],
            succeeded=outcome == "succeeded",
            evidence=str(form.get("evidence", ""))[:4000],
            resolved_by=who.subject,
            roles=who.roles,
            tenant=who.tenant,
        )
        try:
            resolved = await resolve_call(store, resolution, datetime.now(UTC))
        except ResolutionRefused as exc:
            return await show_unresolved(
                request, who, status_code=exc.http_status, error=f"Refused ({exc.code}): {exc}"
            )
        return RedirectResponse(f"/console/calls/{resolved.tool_call_id}", status_code=303)

    async def call(request: Request) -> Response:
        who = await session(request)
        if who is None:
            return to_login()
        tool_call_id = request.path_params["tool_call_id"]
        found = await anyio.to_thread.run_sync(lambda: store.get_call(tool_call_id, tenant=who.tenant))
        if found is None or not may_read(who, found.subject):
            return render(request, "message.html", 404, who=who, message="No such call.")
        events = await anyio.to_thread.run_sync(lambda: store.events(tool_call_id=tool_call_id))
        settled = found.status in TERMINAL_STATUSES or found.escalated
        return render(
            request,
            "call.html",
            who=who,
            call=found,
            events=timeline(events),
            settled=settled,
            outcome=outcome_text(found),
        )

    return [
        Route("/console", index, methods=["GET"]),
        Route("/console/login", login_form, methods=["GET"]),
        Route("/console/login", login, methods=["POST"]),
        Route("/console/logout", logout, methods=["POST"]),
        Route("/console/inbox", inbox, methods=["GET"]),
        Route("/console/approvals/{approval_id}", approval, methods=["GET"]),
        Route("/console/approvals/{approval_id}/decision", decide, methods=["POST"]),
        Route("/console/calls/{tool_call_id}", call, methods=["GET"]),
        Route("/console/unresolved", unresolved, methods=["GET"]),
        Route("/console/calls/{tool_call_id}/resolution", resolve, methods=["POST"]),
        Mount("/console/static", app=StaticFiles(directory=str(HERE / "static")), name="console-static"),
    ]


def _shown(value: Any) -> Any:
    return value if isinstance(value, Markup) else visible(value)
