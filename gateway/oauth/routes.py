"""The authorization server's HTTP face: metadata (RFC 8414 and OpenID discovery), JWKS, /register,
/authorize (login and consent), /token and /revoke. Each request is read whole here and handed to the
server in a worker thread."""

from __future__ import annotations

import json
from collections.abc import Callable
from urllib.parse import parse_qsl, urlsplit

import anyio.to_thread
from authlib.common.urls import add_params_to_uri
from authlib.oauth2.rfc6749 import OAuth2Error
from mcp.server.auth.routes import cors_middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from gateway.auth.standing import revoked_text
from gateway.oauth.login import LoginStep
from gateway.oauth.openid import provider_metadata
from gateway.oauth.pages import Pages
from gateway.oauth.requests import Answer, HttpJsonRequest, HttpRequest
from gateway.oauth.server import SOURCE, WritAuthorizationServer
from gateway.oauth.signin import Pending, SigninCookies, csrf_ok
from policy.model import Principal
from store.oauth import Grantee
from store.ports import Standing

RegistrationLimit = Callable[[str], float | None]
"""Takes one registration for a client address: None if allowed, else the seconds to wait."""


class AuthorizationRoutes:
    def __init__(
        self,
        server: WritAuthorizationServer,
        login: LoginStep,
        pages: Pages,
        cookies: SigninCookies,
        registration_limit: RegistrationLimit,
        standing: Standing,
    ) -> None:
        self.server = server
        self.standing = standing
        self.login = login
        self.pages = pages
        self.cookies = cookies
        self.registration_limit = registration_limit

    def routes(self) -> list[BaseRoute]:
        path = urlsplit(self.server.settings.base_url).path
        metadata = cors_middleware(self.metadata, ["GET", "OPTIONS"])
        discovery = cors_middleware(self.openid_configuration, ["GET", "OPTIONS"])
        routes: list[BaseRoute] = [
            Route("/.well-known/oauth-authorization-server", metadata, methods=["GET", "OPTIONS"]),
            # OpenID Connect Discovery 1.0 §4: `{issuer}/.well-known/openid-configuration`, which for an
            # issuer with a path is this route behind the proxy that strips the path.
            Route("/.well-known/openid-configuration", discovery, methods=["GET", "OPTIONS"]),
            Route("/jwks.json", cors_middleware(self.jwks, ["GET", "OPTIONS"]), methods=["GET", "OPTIONS"]),
            Route(
                "/register", cors_middleware(self.register, ["POST", "OPTIONS"]), methods=["POST", "OPTIONS"]
            ),
            Route("/token", cors_middleware(self.token, ["POST", "OPTIONS"]), methods=["POST", "OPTIONS"]),
            Route("/revoke", cors_middleware(self.revoke, ["POST", "OPTIONS"]), methods=["POST", "OPTIONS"]),
            Route("/authorize", self.authorize, methods=["GET"]),
            Route("/authorize/consent", self.consent, methods=["POST"]),
            *self.login.routes(self.signed_in, self.refused),
        ]
        if path:  # RFC 8414 §3 (and §5 for OpenID): the issuer's path goes after the well-known part
            routes.append(
                Route(f"/.well-known/oauth-authorization-server{path}", metadata, methods=["GET", "OPTIONS"])
            )
            routes.append(
                Route(f"/.well-known/openid-configuration{path}", discovery, methods=["GET", "OPTIONS"])
            )
        return routes

    async def metadata(self, request: Request) -> Response:
        return JSONResponse(self.server.metadata(), headers={"Cache-Control": "public, max-age=300"})

    async def openid_configuration(self, request: Request) -> Response:
        return JSONResponse(provider_metadata(self.server), headers={"Cache-Control": "public, max-age=300"})

    async def jwks(self, request: Request) -> Response:
        return JSONResponse(self.server.keys.jwks(), headers={"Cache-Control": "public, max-age=300"})

    async def register(self, request: Request) -> Response:
        address = request.client.host if request.client else "unknown"
        wait = await anyio.to_thread.run_sync(self.registration_limit, address)
        if wait is not None:
            return JSONResponse(
                {
                    "error": "too_many_requests",
                    "error_description": "too many registrations from this address",
                },
                status_code=429,
                headers={"Retry-After": str(max(1, round(wait)))},
            )
        try:
            body = json.loads(await request.body())
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return JSONResponse(
                {"error": "invalid_client_metadata", "error_description": "the body must be a JSON object"},
                status_code=400,
            )
        oauth = HttpJsonRequest("POST", self.server.settings.url("/register"), request.headers, body)
        answer = await anyio.to_thread.run_sync(
            self.server.create_endpoint_response, "client_registration", oauth
        )
        return _response(answer)

    async def token(self, request: Request) -> Response:
        _note_source(request)
        oauth = HttpRequest(
            "POST", self.server.settings.url("/token"), request.headers, form=await _form(request)
        )
        return _response(await anyio.to_thread.run_sync(self.server.create_token_response, oauth))

    async def revoke(self, request: Request) -> Response:
        _note_source(request)
        oauth = HttpRequest(
            "POST", self.server.settings.url("/revoke"), request.headers, form=await _form(request)
        )
        answer = await anyio.to_thread.run_sync(self.server.create_endpoint_response, "revocation", oauth)
        return _response(answer)

    # -- the sign-in: /authorize, the login step, the consent ---------------------------------

    def _authorization_request(self, request: Request, query: str) -> HttpRequest:
        url = self.server.settings.url("/authorize") + (f"?{query}" if query else "")
        return HttpRequest("GET", url, request.headers, query=parse_qsl(query, keep_blank_values=True))

    async def authorize(self, request: Request) -> Response:
        """Validate the client's request; a valid one goes to the login step, a bad one back to the
        client (when its redirect URI is known good) or to a page saying what is wrong."""
        _note_source(request)
        query = request.url.query
        oauth = self._authorization_request(request, query)
        try:
            grant = await anyio.to_thread.run_sync(self.server.get_consent_grant, oauth)
        except OAuth2Error as error:
            return self._refusal(request, error)
        pending = Pending.start(query)
        response = await self.login.begin(request, pending, grant.client)
        self.cookies.put(response, pending)
        return response

    async def signed_in(self, request: Request, pending: Pending, user: Grantee) -> Response:
        """The consent page, for a request validated again (its client may be gone by now)."""
        _note_source(request)
        if await self._revoked(user):
            return self._revoked_page(request, user)
        oauth = self._authorization_request(request, pending.query)
        try:
            grant = await anyio.to_thread.run_sync(self.server.get_consent_grant, oauth)
        except OAuth2Error as error:
            return self._refusal(request, error)
        redirect_uri = oauth.payload.redirect_uri or grant.client.get_default_redirect_uri()
        settings = self.server.settings
        response = self.pages.render(
            request,
            "consent.html",
            redirect_uri=redirect_uri,
            csrf=pending.csrf,
            client=grant.client,
            user=user,
            resource=settings.resource,
            scope=grant.request.scope,
            access_minutes=max(1, settings.access_token_ttl_s // 60),
            refresh_idle=duration_text(settings.refresh_token_ttl_s),
            sign_in_for=duration_text(settings.sign_in_max_age_s),
        )
        self.cookies.put(response, pending.signed_in(user))
        return response

    async def refused(self, request: Request, pending: Pending, error: str, description: str) -> Response:
        """The login step could not say who it is: `error` to the client's redirect URI, as a denial."""
        _note_source(request)
        oauth = self._authorization_request(request, pending.query)
        try:
            grant = await anyio.to_thread.run_sync(self.server.get_consent_grant, oauth)
        except OAuth2Error as invalid:
            return self._refusal(request, invalid)
        redirect_uri = oauth.payload.redirect_uri or grant.client.get_default_redirect_uri()
        text = "".join(c for c in description if c in _DESCRIBABLE)
        refusal = OAuth2Error(text, state=oauth.payload.state, redirect_uri=redirect_uri, error=error)
        response = self._to_client(self.server.handle_error_response(None, refusal))
        self.cookies.clear(response)
        return response

    async def consent(self, request: Request) -> Response:
        """Allow: a code to the client's redirect URI; deny: `access_denied` there."""
        _note_source(request)
        pending = self.cookies.read(request)
        form = await request.form()
        if pending is None or pending.user is None or not csrf_ok(pending, form.get("csrf")):
            return self.pages.expired(request)
        user = pending.user
        if await self._revoked(user):  # since the login: no code (and the sign-in is over)
            response = self._revoked_page(request, user)
            self.cookies.clear(response)
            return response
        allowed = form.get("decision") == "allow"
        oauth = self._authorization_request(request, pending.query)

        def decide() -> Answer:
            grant = self.server.get_consent_grant(oauth, end_user=user)
            answer: Answer = self.server.create_authorization_response(
                oauth, grant_user=user if allowed else None, grant=grant
            )
            return answer

        try:
            answer = await anyio.to_thread.run_sync(decide)
        except OAuth2Error as error:
            return self._refusal(request, error)
        response = self._to_client(answer)
        self.cookies.clear(response)
        return response

    async def _revoked(self, user: Grantee) -> bool:
        return bool(await anyio.to_thread.run_sync(self.standing.is_revoked, user.tenant, user.subject))

    def _revoked_page(self, request: Request, user: Grantee) -> Response:
        who = Principal(subject=user.subject, tenant=user.tenant, roles=frozenset(user.roles))
        return self.pages.problem(request, f"{revoked_text(who)}.", status_code=403)

    def _refusal(self, request: Request, error: OAuth2Error) -> Response:
        if error.redirect_uri:
            return self._to_client(self.server.handle_error_response(None, error))
        return self.pages.problem(
            request, f"{error.error}: {error.description or 'the request is not valid'}"
        )

    def _to_client(self, answer: Answer) -> Response:
        location = answer.location
        if answer.status != 302 or location is None:
            return _response(answer)
        # RFC 9207: say who answers, on success and error alike (authlib's helper needs Flask or Django).
        return RedirectResponse(
            add_params_to_uri(location, [("iss", self.server.settings.issuer)]),
            status_code=302,
            headers={"Cache-Control": "no-store"},
        )


def _note_source(request: Request) -> None:
    """The client's address, for the security events the server notes while serving this request."""
    SOURCE.set(request.client.host if request.client else None)


# RFC 6749 §5.2: what an error_description may hold.
_DESCRIBABLE = frozenset(chr(c) for c in range(0x20, 0x7F) if chr(c) not in '"\\')


async def _form(request: Request) -> list[tuple[str, str]]:
    form = await request.form()
    return [(k, v) for k, v in form.multi_items() if isinstance(v, str)]


def _response(answer: Answer) -> Response:
    headers = dict(answer.headers)
    if isinstance(answer.body, str):
        return Response(answer.body, status_code=answer.status, headers=headers)
    headers.pop("Content-Type", None)
    return JSONResponse(dict(answer.body), status_code=answer.status, headers=headers)


def duration_text(seconds: int) -> str:
    """A lifetime as the consent page says it: in days, hours or minutes, whichever is whole."""
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            count = seconds // size
            return f"{count} {unit}{'s' if count != 1 else ''}"
    return f"{max(1, round(seconds / 60))} minutes"
