"""The login step through upstream OpenID providers: who signs in is whoever the provider says.

`begin` sends the browser to the provider (straight there when there is one, through a page to choose
one when there are several) with Writ's own registration, PKCE S256, a `state` and a `nonce`. The
provider returns the browser to `/authorize/oidc/{id}/callback` (one redirect URI per provider, so an
answer cannot be taken for another provider's: the mix-up defence of RFC 9700 §4.4.2), where the
state is checked, the code exchanged, the ID token verified and the user handed to `signed_in`.

What the callback must match travels in a cookie of its own beside the sign-in's (signed with the
authorization server's key, bound to that sign-in's CSRF token), so any replica serves any step.

A callback that does not match the browser's sign-in (no sign-in, another state, another provider)
ends on a page: nothing says it belongs to the client. Once it matches, the client hears how it
ended: `access_denied` when the provider or Writ refuses the person or the provider's answer,
`temporarily_unavailable` when the provider cannot be reached.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Sequence

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from gateway.audit.security import NoSecurityEvents, SecurityRefusal, SecuritySink
from gateway.auth.issuers import IssuerUnavailable
from gateway.oauth.keys import SigningKeys
from gateway.oauth.login import Refused, SignedIn
from gateway.oauth.models import Client
from gateway.oauth.pages import Pages
from gateway.oauth.signin import Pending, SignedCookie, SigninCookies, csrf_ok
from gateway.oauth.upstream import Attempt, UpstreamProvider, UpstreamRefused

logger = logging.getLogger(__name__)

COOKIE = "writ_upstream"


class AttemptCookies:
    """The redirect to a provider in progress, bound to the sign-in (its CSRF token) it belongs to."""

    def __init__(self, keys: SigningKeys, issuer: str, *, ttl_s: int, secure: bool) -> None:
        self._cookie = SignedCookie(keys, issuer, name=COOKIE, purpose="upstream", ttl_s=ttl_s, secure=secure)

    def put(self, response: Response, pending: Pending, attempt: Attempt) -> None:
        claims = {
            "csrf": pending.csrf,
            "provider": attempt.provider,
            "state": attempt.state,
            "nonce": attempt.nonce,
            "verifier": attempt.verifier,
        }
        self._cookie.put(response, claims)

    def read(self, request: Request, pending: Pending) -> Attempt | None:
        """The attempt of this browser's sign-in; None if none, expired, forged or another sign-in's."""
        claims = self._cookie.read(request)
        if claims is None:
            return None
        if not csrf_ok(pending, claims.get("csrf")):
            return None
        return Attempt(
            str(claims["provider"]), str(claims["state"]), str(claims["nonce"]), str(claims["verifier"])
        )

    def clear(self, response: Response) -> None:
        self._cookie.clear(response)


class OidcLogin:
    """The `LoginStep` of `login: {type: oidc}`."""

    def __init__(
        self,
        providers: Sequence[UpstreamProvider],
        pages: Pages,
        cookies: SigninCookies,
        attempts: AttemptCookies,
        security: SecuritySink | None = None,
    ) -> None:
        self._security = security or NoSecurityEvents()
        self._providers = {p.id: p for p in providers}
        self._pages = pages
        self._cookies = cookies
        self._attempts = attempts

    async def begin(self, request: Request, pending: Pending, client: Client) -> Response:
        if len(self._providers) == 1:
            (provider,) = self._providers.values()
            return await self._redirect(request, pending, provider)
        return self._pages.render(
            request, "choose.html", csrf=pending.csrf, providers=list(self._providers.values()), client=client
        )

    def routes(self, signed_in: SignedIn, refused: Refused) -> list[BaseRoute]:
        async def chosen(request: Request) -> Response:
            pending = self._cookies.read(request)
            provider = self._providers.get(request.path_params["provider"])
            if provider is None:
                return self._unknown(request)
            given = request.query_params.get("csrf", "")
            if pending is None or not csrf_ok(pending, given):
                return self._pages.expired(request)
            return await self._redirect(request, pending, provider)

        async def callback(request: Request) -> Response:
            provider = self._providers.get(request.path_params["provider"])
            if provider is None:
                return self._unknown(request)
            pending = self._cookies.read(request)
            if pending is None:
                return self._pages.expired(request)
            attempt = self._attempts.read(request, pending)
            state = request.query_params.get("state", "")
            if (
                attempt is None
                or attempt.provider != provider.id
                or not secrets.compare_digest(state.encode(), attempt.state.encode())
            ):
                logger.warning(
                    "sign-in through %s: the callback does not match this browser's sign-in", provider.id
                )
                self._refused(request, "upstream_bad_state", provider)
                return self._pages.problem(
                    request,
                    f"The answer from {provider.name} does not belong to the sign-in this browser started "
                    "(its state does not match). Start again from your client.",
                )
            return self._ended(await self._answered(request, pending, provider, attempt, signed_in, refused))

        return [
            Route("/authorize/oidc/{provider}", chosen, methods=["GET"]),
            Route("/authorize/oidc/{provider}/callback", callback, methods=["GET"]),
        ]

    async def _answered(
        self,
        request: Request,
        pending: Pending,
        provider: UpstreamProvider,
        attempt: Attempt,
        signed_in: SignedIn,
        refused: Refused,
    ) -> Response:
        """The provider's answer to this browser's own attempt: the user, or a refusal to the client."""
        params = request.query_params
        if "iss" in params and params["iss"] != provider.registration.issuer:
            # RFC 9207: the answer names another issuer than the one this callback is for (mix-up).
            logger.warning(
                "sign-in through %s: the callback names issuer %r", provider.id, params["iss"][:200]
            )
            self._refused(request, "upstream_issuer_mismatch", provider)
            description = f"the answer at {provider.name}'s callback names another issuer"
            return await refused(request, pending, "access_denied", description)
        if "error" in params:
            error = params["error"][:100]
            logger.warning(
                "sign-in through %s: the provider answered %r (%r)",
                provider.id,
                error,
                params.get("error_description", "")[:300],
            )
            answer = "temporarily_unavailable" if error == "temporarily_unavailable" else "access_denied"
            return await refused(request, pending, answer, f"{provider.name} answered {error}")
        code = params.get("code")
        if not code:
            return self._pages.problem(request, f"The answer from {provider.name} holds no code.")
        try:
            user = await provider.sign_in(code, attempt)
        except UpstreamRefused as exc:
            logger.warning("sign-in through %s refused: %s", provider.id, exc)
            self._refused(request, "upstream_refused", provider)
            return await refused(request, pending, "access_denied", str(exc))
        except IssuerUnavailable as exc:
            logger.error("sign-in through %s failed: %s", provider.id, exc)
            description = f"{provider.name} cannot be reached; try again later"
            return await refused(request, pending, "temporarily_unavailable", description)
        logger.info("signed in through %s: %s in tenant %s", provider.id, user.subject, user.tenant)
        return await signed_in(request, pending, user)

    async def _redirect(self, request: Request, pending: Pending, provider: UpstreamProvider) -> Response:
        attempt = Attempt.start(provider.id)
        try:
            url = await provider.authorization_url(attempt)
        except IssuerUnavailable as exc:
            logger.error("sign-in through %s: %s", provider.id, exc)
            return self._pages.problem(
                request, f"{provider.name} cannot be reached right now. Try again later.", status_code=502
            )
        response = RedirectResponse(url, status_code=302, headers={"Cache-Control": "no-store"})
        self._attempts.put(response, pending, attempt)
        return response

    def _refused(self, request: Request, kind: str, provider: UpstreamProvider) -> None:
        """A `security.oauth_refused` naming the provider's issuer: never its answer, code or token."""
        source = request.client.host if request.client else None
        issuer = provider.registration.issuer
        self._security.note(SecurityRefusal("security.oauth_refused", kind, source, issuer=issuer))

    def _ended(self, response: Response) -> Response:
        self._attempts.clear(response)
        return response

    def _unknown(self, request: Request) -> Response:
        return self._pages.problem(
            request, "There is no identity provider of that name here.", status_code=404
        )
