"""The console's routes: login, inbox, one approval, its decision, a call's timeline, unresolved calls;
the runs pages are `gateway.console.runs`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio.to_thread
from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from gateway.audit.security import NoSecurityEvents, SecurityRefusal, SecuritySink, shown
from gateway.auth.oversight import OVERSEER_ROLES, may_read
from gateway.auth.standing import is_revoked, revoked_text
from gateway.auth.tokens import Claimed, TokenRejected
from gateway.calls.approvals import DecisionInput, Decisions
from gateway.calls.pipeline import CallReport
from gateway.calls.resolutions import RESOLVER_ROLES, ResolutionInput, resolve_call
from gateway.calls.retries import RETRY_ROLES, RetryRequest, retry_links
from gateway.clock import Clock
from gateway.console.clients import ClientPages
from gateway.console.csrf import csrf_token, from_origin, origin_of, token_ok
from gateway.console.runs import RunPages
from gateway.console.sessions import Sessions, SignIn
from gateway.console.views import InForce, approval_card, status_note, timeline, unresolved_card
from gateway.display import visible
from gateway.errors import Refused
from gateway.mcp.results import outcome_text
from gateway.reasons import ReasonCode
from policy.model import Principal
from store.model import TERMINAL_STATUSES
from store.oauth_clients import Liveness
from store.ports import ConsoleSessions, OAuthClients, Oversight, RunControls

HERE = Path(__file__).parent
SESSION_COOKIE = "writ_session"
OLD_CSRF_COOKIE = "writ_csrf"
"""The random double-submit token earlier versions kept; logging out still drops it."""

TokenVerifier = Callable[[str], Awaitable[SignIn | None]]
"""What a bearer token verifies as (the same check as /mcp); None, or `TokenRejected` saying why, for
one that is not acceptable."""

DECISION_REFUSED: Mapping[str, str] = {
    ReasonCode.NOT_FOUND: "No such approval.",
    ReasonCode.NOT_APPROVER: "You do not hold the role this approval needs.",
    ReasonCode.SELF_APPROVAL_FORBIDDEN: (
        "You requested this call, or asked for this retry of it; the policy does not let you approve it"
        " yourself."
    ),
    ReasonCode.ALREADY_DECIDED: "This approval was already decided; nothing was changed.",
    ReasonCode.EXPIRED: "This approval expired before it was decided; nothing was changed.",
    ReasonCode.INVALID_REQUEST: "The reason cannot contain NUL characters; nothing was changed.",
}
"""What a refused decision tells the person, in the console's words (others say the refusal's own)."""


def refused_text(exc: Refused, said: Mapping[str, str] | None = None) -> str:
    """The console's one sentence for a refusal: its code, and `said`'s words for it or its own."""
    return f"Refused ({exc.code}): {(said or {}).get(exc.code, str(exc))}"


STALE_FORM = "This form is stale or did not come from this console; reload the page and try again."

Handler = Callable[[Request, Principal], Awaitable[Response]]
Retries = Callable[[RetryRequest], Awaitable[CallReport]]
"""Re-runs a failed call through the gateway's pipeline (`gateway.calls.retries.retry_call`)."""
Endpoint = Callable[[Request], Awaitable[Response]]


class Console:
    """The console's pages, one method per route; `signed_in` is the one session guard."""

    def __init__(
        self,
        *,
        store: Oversight,
        sessions: ConsoleSessions,
        decisions: Decisions,
        verify: TokenVerifier,
        clock: Clock,
        secure_cookies: bool = False,
        public_url: str | None = None,
        in_force: InForce | None = None,
        clients: ClientPages | None = None,
        security: SecuritySink | None = None,
        runs: RunControls | None = None,
        retries: Retries | None = None,
    ) -> None:
        self.security = security or NoSecurityEvents()
        self.runs = runs
        self.retries = retries
        self.store = store
        self.sessions = Sessions(sessions)
        self.clients = clients
        self.clock = clock
        self.decisions = decisions
        self.verify = verify
        self.secure_cookies = secure_cookies
        self.public_origin = origin_of(public_url) if public_url else None
        self.public_scheme = urlsplit(public_url).scheme if public_url else None
        self.in_force = in_force
        self.templates = Jinja2Templates(directory=str(HERE / "templates"))
        # Every value a page prints, argument or summary or name, shows hidden characters as code points.
        self.templates.env.finalize = _shown

    def routes(self) -> list[BaseRoute]:
        """The console's routes under /console."""
        signed_in = self.signed_in
        return [
            Route("/console", self.index, methods=["GET"]),
            Route("/console/login", self.login_form, methods=["GET"]),
            Route("/console/login", self.login, methods=["POST"]),
            Route("/console/logout", self.logout, methods=["POST"]),
            Route("/console/inbox", signed_in(self.inbox), methods=["GET"]),
            Route("/console/approvals/{approval_id}", signed_in(self.approval), methods=["GET"]),
            Route("/console/approvals/{approval_id}/decision", signed_in(self.decide), methods=["POST"]),
            Route("/console/calls/{tool_call_id}", signed_in(self.call), methods=["GET"]),
            Route("/console/unresolved", signed_in(self.show_unresolved), methods=["GET"]),
            Route("/console/calls/{tool_call_id}/resolution", signed_in(self.resolve), methods=["POST"]),
            Route("/console/calls/{tool_call_id}/retry", signed_in(self.retry), methods=["POST"]),
            *(self.clients.routes() if self.clients is not None else []),
            *(RunPages(self, self.runs, self.clock).routes() if self.runs is not None else []),
            Mount("/console/static", app=StaticFiles(directory=str(HERE / "static")), name="console-static"),
        ]

    def signed_in(self, handler: Handler) -> Endpoint:
        """`handler` for a session in good standing; anyone else goes to the login page."""

        async def endpoint(request: Request) -> Response:
            who = await self.session(request)
            return _to_login() if who is None else await handler(request, who)

        return endpoint

    async def session(self, request: Request) -> Principal | None:
        """The session's principal; None without a session, for one unknown, ended or expired, or once
        the principal is revoked."""
        # Every page and form asks the store, not only the login: a session opened before a
        # revocation ends with it (back to the login page, where logging in again says why). A cookie
        # naming no session is not a failed authentication: it is what a browser keeps after logging
        # out, and a session id cannot be guessed.
        session_id = request.cookies.get(SESSION_COOKIE)
        who = await self.sessions.principal(session_id, self.clock()) if session_id else None
        return None if who is None or await is_revoked(self.store, who) else who

    async def verified(self, request: Request, token: str) -> SignIn | None:
        """What the token pasted at /console/login verifies as; a token refused is noted as
        `security.auth_failed` of its kind, from the client's address, on the login's path. Never
        the token."""
        try:
            return await self.verify(token)
        except TokenRejected as exc:
            claimed = exc.claimed
            self._note(request, exc.kind, claimed.tenant if claimed else None, claimed, None)
            return None

    def _note(
        self,
        request: Request,
        kind: str,
        tenant: str | None,
        claimed: Claimed | None,
        who: Principal | None,
    ) -> None:
        self.security.note(
            SecurityRefusal(
                "security.auth_failed",
                kind,
                source=request.client.host if request.client else None,
                tenant=tenant,
                issuer=claimed.issuer if claimed else None,
                subject=claimed.subject if claimed else (who.subject if who else None),
                path=shown(request.url.path),
            )
        )

    def from_console(self, request: Request) -> bool:
        """Whether a POST came from the console's own pages (or from no browser): its `Origin` is the
        console's, and its `Sec-Fetch-Site` says the same. Refused otherwise, before any token counts."""
        # The public URL's origin where one is configured (behind a proxy the request's own scheme may
        # be plain http). Without one nothing proxies: the origin the browser asked for, as its Host
        # header names it, which no other page can choose (127.0.0.1 or localhost, as the user typed).
        # With a public URL, the host the browser asked for is the console's too, under the public URL's
        # scheme: compose's `public_url: http://localhost:8080` is also reached at 127.0.0.1:8080, and
        # no other page can choose the Host header of the request it makes the browser send.
        expected = {origin_of(str(request.url))}
        if self.public_origin is not None:
            host = request.headers.get("host", "")
            expected = {self.public_origin, origin_of(f"{self.public_scheme}://{host}")}
        return from_origin(request.headers.get("origin"), request.headers.get("sec-fetch-site"), expected)

    def form_ok(self, request: Request, form: Any) -> bool:
        """Whether a signed-in form may act: posted from the console, carrying its session's token."""
        return self.from_console(request) and token_ok(request.cookies.get(SESSION_COOKIE), form.get("csrf"))

    def render(self, request: Request, name: str, status_code: int = 200, **context: Any) -> Response:
        """A page, never cached, framed or posting elsewhere."""
        session = request.cookies.get(SESSION_COOKIE)
        context.setdefault("csrf", csrf_token(session) if session else "")
        context.setdefault("who", None)
        response = self.templates.TemplateResponse(request, name, context, status_code=status_code)
        response.headers["Cache-Control"] = "no-store"
        response.headers["X-Frame-Options"] = "DENY"
        response.headers["Content-Security-Policy"] = (
            "default-src 'self'; frame-ancestors 'none'; form-action 'self'"
        )
        return response

    async def index(self, request: Request) -> Response:
        """GET /console: the inbox when signed in, else the login page."""
        return RedirectResponse("/console/inbox" if await self.session(request) else "/console/login", 303)

    async def login_form(self, request: Request) -> Response:
        """GET /console/login."""
        return self.render(request, "login.html")

    async def login(self, request: Request) -> Response:
        """POST /console/login: a pasted token opens a session, whose id (never the token) the cookie
        holds."""
        # The login form has no CSRF token (there is no session yet): another page could post its own
        # token here and have the approver's browser work, unknowingly, in that session. Browsers say
        # where a request comes from; one from any other origin is refused, a sibling port or
        # subdomain (`Sec-Fetch-Site: same-site`) too.
        if not self.from_console(request):
            return self.render(
                request, "login.html", 403, error="Log in from this page, not from another site."
            )
        form = await request.form()
        token = str(form.get("token", "")).strip()
        if token.lower().startswith("bearer "):
            token = token[7:].strip()
        sign_in = await self.verified(request, token) if token else None
        if sign_in is None:
            return self.render(
                request, "login.html", 401, error="That token did not verify. Paste a valid token."
            )
        who, now = sign_in.principal, self.clock()
        if await is_revoked(self.store, who):
            self._note(request, "principal_revoked", who.tenant, None, who)
            return self.render(request, "login.html", 403, error=f"Refused: {revoked_text(who)}.")
        if sign_in.expires_at <= now:  # verified within the verifier's leeway: no session to open
            return self.render(
                request, "login.html", 401, error="That token has expired. Paste a valid token."
            )
        session_id = await self.sessions.open(sign_in, now)
        replaced = request.cookies.get(SESSION_COOKIE)
        if replaced:  # logging in again: the browser's earlier session ends with its cookie
            await self.sessions.end(replaced, now)
        response = RedirectResponse("/console/inbox", status_code=303)
        # No max_age: the cookie ends with the browser, the session in the store at its expiry.
        response.set_cookie(
            SESSION_COOKIE,
            session_id,
            httponly=True,
            samesite="strict",
            secure=self.secure_cookies,
            path="/console",
        )
        return response

    async def logout(self, request: Request) -> Response:
        """POST /console/logout: the session ends in the store (a copy of its cookie opens nothing
        afterwards) and the session's cookies are dropped."""
        form = await request.form()
        if not self.form_ok(request, form):
            return self.render(request, "message.html", 403, message="The form was stale; log out again.")
        session_id = request.cookies.get(SESSION_COOKIE)
        if session_id:  # form_ok: the form carries this session's CSRF token
            await self.sessions.end(session_id, self.clock())
        response = _to_login()
        response.delete_cookie(SESSION_COOKIE, path="/console")
        response.delete_cookie(OLD_CSRF_COOKIE, path="/console")
        return response

    async def inbox(self, request: Request, who: Principal) -> Response:
        """GET /console/inbox: approvals waiting, and the latest decided, for overseers."""
        if not who.roles & OVERSEER_ROLES:
            message = "The approval inbox needs the approver, auditor or admin role."
            return self.render(request, "message.html", 403, who=who, message=message)
        now = self.clock()

        def load() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
            store = self.store
            pending = store.list_approvals(tenant=who.tenant, status="awaiting_approval")
            decided = [a for a in store.list_approvals(tenant=who.tenant) if a.status != "awaiting_approval"]
            cards = [approval_card(store, a, who, now, self.in_force) for a in pending]
            return cards, [approval_card(store, a, who, now) for a in decided[-20:][::-1]]

        pending, decided = await anyio.to_thread.run_sync(load)
        return self.render(request, "inbox.html", who=who, pending=pending, decided=decided)

    async def approval(self, request: Request, who: Principal) -> Response:
        """GET /console/approvals/{id}: the exact effect an approver decides on."""
        return await self.show_approval(request, who, request.path_params["approval_id"])

    async def show_approval(
        self,
        request: Request,
        who: Principal,
        approval_id: str,
        *,
        error: str | None = None,
        status_code: int = 200,
    ) -> Response:
        found = await anyio.to_thread.run_sync(
            lambda: self.store.get_approval(approval_id, tenant=who.tenant)
        )
        if found is None or not may_read(who, found.requester):
            return self.render(request, "message.html", 404, who=who, message="No such approval.")
        card = await anyio.to_thread.run_sync(
            lambda: approval_card(self.store, found, who, self.clock(), self.in_force)
        )
        return self.render(request, "approval.html", status_code, who=who, card=card, error=error)

    async def decide(self, request: Request, who: Principal) -> Response:
        """POST /console/approvals/{id}/decision: approve or reject, then the call's timeline."""
        approval_id = request.path_params["approval_id"]
        form = await request.form()
        if not self.form_ok(request, form):
            return await self.show_approval(request, who, approval_id, status_code=403, error=STALE_FORM)
        choice = str(form.get("decision", ""))
        if choice not in ("approve", "reject"):
            return await self.show_approval(
                request, who, approval_id, status_code=400, error="Choose approve or reject."
            )
        reason = str(form.get("reason", "")).strip()[:2000] or None
        try:
            decided = await self.decisions.decide(
                DecisionInput(
                    approval_id=approval_id,
                    approve=choice == "approve",
                    decided_by=who.subject,
                    reason=reason,
                    roles=who.roles,
                    tenant=who.tenant,
                )
            )
        except Refused as exc:
            error = refused_text(exc, DECISION_REFUSED)
            return await self.show_approval(
                request, who, approval_id, status_code=exc.http_status, error=error
            )
        return RedirectResponse(f"/console/calls/{decided.tool_call_id}", status_code=303)

    async def show_unresolved(
        self, request: Request, who: Principal, *, error: str | None = None, status_code: int = 200
    ) -> Response:
        """GET /console/unresolved: calls whose outcome a person must settle, for resolvers."""
        if not who.roles & RESOLVER_ROLES:
            message = "Resolving calls needs the approver or admin role."
            return self.render(request, "message.html", 403, who=who, message=message)

        def load() -> list[dict[str, Any]]:
            calls = self.store.list_calls(tenant=who.tenant, unresolved=True)
            return [unresolved_card(self.store, c) for c in calls]

        cards = await anyio.to_thread.run_sync(load)
        return self.render(request, "unresolved.html", status_code, who=who, cards=cards, error=error)

    async def resolve(self, request: Request, who: Principal) -> Response:
        """POST /console/calls/{id}/resolution: a person records what happened, with evidence."""
        form = await request.form()
        if not self.form_ok(request, form):
            return await self.show_unresolved(request, who, status_code=403, error=STALE_FORM)
        outcome = str(form.get("outcome", ""))
        if outcome not in ("succeeded", "failed"):
            return await self.show_unresolved(
                request, who, status_code=400, error="Choose succeeded or failed."
            )
        resolution = ResolutionInput(
            tool_call_id=request.path_params["tool_call_id"],
            succeeded=outcome == "succeeded",
            evidence=str(form.get("evidence", ""))[:4000],
            resolved_by=who.subject,
            roles=who.roles,
            tenant=who.tenant,
        )
        try:
            resolved = await resolve_call(self.store, resolution, self.clock())
        except Refused as exc:
            return await self.show_unresolved(
                request, who, status_code=exc.http_status, error=refused_text(exc)
            )
        return RedirectResponse(f"/console/calls/{resolved.tool_call_id}", status_code=303)

    async def call(self, request: Request, who: Principal) -> Response:
        """GET /console/calls/{id}: a call's timeline and what Writ knows of its effect."""
        return await self.show_call(request, who, request.path_params["tool_call_id"])

    async def show_call(
        self,
        request: Request,
        who: Principal,
        tool_call_id: str,
        *,
        error: str | None = None,
        status_code: int = 200,
    ) -> Response:
        found = await anyio.to_thread.run_sync(lambda: self.store.get_call(tool_call_id, tenant=who.tenant))
        if found is None or not may_read(who, found.subject):
            return self.render(request, "message.html", 404, who=who, message="No such call.")
        events = await anyio.to_thread.run_sync(lambda: self.store.events(tool_call_id=tool_call_id))
        settled = found.status in TERMINAL_STATUSES or found.escalated
        links = retry_links(events)
        # The button only where a retry could be admitted; the service decides again when it is pressed.
        may_retry = (
            self.retries is not None
            and found.status == "failed"
            and not found.contradicted
            and "retriedAs" not in links
            and bool(who.roles & RETRY_ROLES)
        )
        return self.render(
            request,
            "call.html",
            status_code,
            who=who,
            call=found,
            events=timeline(events),
            settled=settled,
            outcome=outcome_text(found),
            note=status_note(found),
            links=links,
            may_retry=may_retry,
            error=error,
        )

    async def retry(self, request: Request, who: Principal) -> Response:
        """POST /console/calls/{id}/retry: re-run a failed call as a new call, then the retry's timeline."""
        tool_call_id = request.path_params["tool_call_id"]
        form = await request.form()
        if not self.form_ok(request, form):
            return await self.show_call(request, who, tool_call_id, status_code=403, error=STALE_FORM)
        if self.retries is None:
            return await self.show_call(request, who, tool_call_id, status_code=404, error="No retries here.")
        req = RetryRequest(
            tool_call_id=tool_call_id,
            by=who.subject,
            reason=str(form.get("reason", "")).strip(),
            roles=who.roles,
            tenant=who.tenant,
        )
        try:
            report = await self.retries(req)
        except Refused as exc:
            return await self.show_call(
                request, who, tool_call_id, status_code=exc.http_status, error=refused_text(exc)
            )
        return RedirectResponse(f"/console/calls/{report.call.tool_call_id}", status_code=303)


def console_routes(
    *,
    store: Oversight,
    sessions: ConsoleSessions,
    decisions: Decisions,
    verify: TokenVerifier,
    clock: Clock,
    secure_cookies: bool = False,
    public_url: str | None = None,
    in_force: InForce | None = None,
    clients: tuple[OAuthClients, Liveness] | None = None,
    security: SecuritySink | None = None,
    runs: RunControls | None = None,
    retries: Retries | None = None,
) -> list[BaseRoute]:
    """The console's routes (see `Console`); with `clients`, the clients page (`ClientPages`); with
    `runs`, the runs pages (`gateway.console.runs`)."""
    console = Console(
        store=store,
        sessions=sessions,
        decisions=decisions,
        verify=verify,
        clock=clock,
        secure_cookies=secure_cookies,
        public_url=public_url,
        in_force=in_force,
        security=security,
        runs=runs,
        retries=retries,
    )
    if clients is not None:
        console.clients = ClientPages(console, clients[0], clients[1], clock)
    return console.routes()


def _to_login() -> Response:
    return RedirectResponse("/console/login", status_code=303)


def _shown(value: Any) -> Any:
    return value if isinstance(value, Markup) else visible(value)
