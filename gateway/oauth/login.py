"""The login step of a sign-in: who the person at the browser is.

A `LoginStep` starts from a validated authorization request (`begin`) and, through routes of its
own, ends by calling `signed_in` with the person's identity; the consent page follows. The built-in
kind lists configured users (for `writ demo`); the upstream OpenID kind (`gateway.oauth.oidc_login`)
redirects to the provider in `begin` and calls `signed_in` from its callback route.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from gateway.config import LoginUser
from gateway.oauth.models import Client
from gateway.oauth.pages import Pages
from gateway.oauth.signin import Pending, SigninCookies, csrf_ok
from store.oauth import Grantee

SignedIn = Callable[[Request, Pending, Grantee], Awaitable[Response]]
"""Continues a sign-in once the login step knows who it is (to the consent page)."""
Refused = Callable[[Request, Pending, str, str], Awaitable[Response]]
"""Ends a sign-in whose login failed: an OAuth `error` (and description) to the client's redirect."""


class LoginStep(Protocol):
    async def begin(self, request: Request, pending: Pending, client: Client) -> Response:
        """The first page (or redirect) of the login, for a validated authorization request."""
        ...

    def routes(self, signed_in: SignedIn, refused: Refused) -> list[BaseRoute]:
        """The step's own routes, under /authorize/, ending in `signed_in` (or `refused`)."""
        ...


class KnownUsers(Protocol):
    def current(self, signed_in: Grantee) -> Grantee | None:
        """Who the person who signed in as `signed_in` is now (roles and groups as they are now);
        None if the login no longer knows them. Asked on every refresh."""
        ...


class AsSignedIn:
    """The `KnownUsers` of a login that cannot be asked again (an upstream provider, which Writ holds
    no refresh token of): a person is who they were at the login, until `sign_in_max_age_s`."""

    def current(self, signed_in: Grantee) -> Grantee | None:
        return signed_in


class ConfiguredUsers:
    """The `KnownUsers` of the built-in login: the users of the configuration Writ runs on now."""

    def __init__(self, users: Sequence[LoginUser]) -> None:
        self._users = {(u.tenant, u.subject): grantee_of(u) for u in reversed(users)}  # the first wins

    def current(self, signed_in: Grantee) -> Grantee | None:
        return self._users.get((signed_in.tenant, signed_in.subject))


def grantee_of(user: LoginUser) -> Grantee:
    """The identity a built-in login user's tokens carry."""
    return Grantee(user.subject, user.tenant, tuple(user.roles), tuple(user.groups))


class BuiltinLogin:
    """A page listing the configured users: choosing one signs in as them (no password: demos only)."""

    def __init__(self, users: Sequence[LoginUser], pages: Pages, cookies: SigninCookies) -> None:
        self._users = list(users)
        self._pages = pages
        self._cookies = cookies

    async def begin(self, request: Request, pending: Pending, client: Client) -> Response:
        return self._pages.render(request, "login.html", csrf=pending.csrf, users=self._users, client=client)

    def routes(self, signed_in: SignedIn, refused: Refused) -> list[BaseRoute]:
        async def choose(request: Request) -> Response:
            pending = self._cookies.read(request)
            form = await request.form()
            if pending is None or not csrf_ok(pending, form.get("csrf")):
                return self._pages.expired(request)
            try:
                user = self._users[int(str(form.get("user", "")))]
            except (ValueError, IndexError):
                return self._pages.problem(request, "Choose one of the users listed.", status_code=400)
            return await signed_in(request, pending, grantee_of(user))

        return [Route("/authorize/login", choose, methods=["POST"])]
