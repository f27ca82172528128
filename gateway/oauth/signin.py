"""A sign-in in progress, between /authorize, the login step and the consent, kept by the browser.

The state travels in one cookie: a JWT signed with the authorization server's own key (so any replica
reads it, and no one can forge or alter it), bound to this issuer and a purpose of its own (an access
token cannot pass for it, nor it for an access token), expiring after `login_ttl_s`. It holds the
client's authorization request as sent, a CSRF token every form echoes, and, once the login step
has run, who signed in.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, replace
from typing import Any

from joserfc import jwt
from joserfc.errors import JoseError
from starlette.requests import Request
from starlette.responses import Response

from gateway.oauth.keys import ALGORITHM, SigningKeys
from store.oauth import Grantee

COOKIE = "writ_signin"
PATH = "/authorize"


@dataclass(frozen=True, slots=True)
class Pending:
    query: str
    """The authorization request's query string, exactly as the client sent it to /authorize."""
    csrf: str
    user: Grantee | None = None

    @classmethod
    def start(cls, query: str) -> Pending:
        return cls(query, secrets.token_urlsafe(24))

    def signed_in(self, user: Grantee) -> Pending:
        return replace(self, user=user)


class SignedCookie:
    """A cookie holding claims signed with the authorization server's key, for one purpose.

    Bound to this issuer, an audience of its own (`{issuer}#{purpose}`) and a `typ`, so neither an
    access token nor another purpose's cookie passes for it; it expires after `ttl_s`. Lax, because
    the redirects that bring the browser back (from the login, from a provider) are top-level GETs.
    """

    def __init__(
        self, keys: SigningKeys, issuer: str, *, name: str, purpose: str, ttl_s: int, secure: bool
    ) -> None:
        self._keys = keys
        self._issuer = issuer
        self._audience = f"{issuer}#{purpose}"
        self._typ = f"writ-{purpose}+jwt"
        self._name = name
        self._ttl_s = ttl_s
        self._secure = secure

    def put(self, response: Response, claims: dict[str, Any]) -> None:
        now = int(time.time())
        envelope = {"iss": self._issuer, "aud": self._audience, "iat": now, "exp": now + self._ttl_s}
        response.set_cookie(
            self._name,
            self._keys.sign({**claims, **envelope}, typ=self._typ),
            max_age=self._ttl_s,
            path=PATH,
            httponly=True,
            samesite="lax",
            secure=self._secure,
        )

    def read(self, request: Request) -> dict[str, Any] | None:
        """The claims, or None if there is no cookie or it is expired or not signed for this purpose."""
        token = request.cookies.get(self._name)
        if not token:
            return None
        try:
            decoded = jwt.decode(token, self._keys.public_keys, algorithms=[ALGORITHM])
            if decoded.header.get("typ") != self._typ:
                return None
            jwt.JWTClaimsRegistry(
                iss={"essential": True, "value": self._issuer},
                aud={"essential": True, "value": self._audience},
                exp={"essential": True},
            ).validate(decoded.claims)
        except (JoseError, ValueError):
            return None
        claims: dict[str, Any] = decoded.claims
        return claims

    def clear(self, response: Response) -> None:
        response.delete_cookie(self._name, path=PATH, httponly=True, samesite="lax", secure=self._secure)


class SigninCookies:
    def __init__(self, keys: SigningKeys, issuer: str, *, ttl_s: int, secure: bool) -> None:
        self._cookie = SignedCookie(keys, issuer, name=COOKIE, purpose="signin", ttl_s=ttl_s, secure=secure)

    def put(self, response: Response, pending: Pending) -> None:
        claims: dict[str, Any] = {"q": pending.query, "csrf": pending.csrf}
        if pending.user is not None:
            user = pending.user
            claims["user"] = {
                "sub": user.subject,
                "tenant": user.tenant,
                "roles": user.roles,
                "groups": user.groups,
            }
        self._cookie.put(response, claims)

    def read(self, request: Request) -> Pending | None:
        """The sign-in this browser is in, None if none, expired or not signed by this server."""
        claims = self._cookie.read(request)
        if claims is None:
            return None
        user = claims.get("user")
        grantee = None
        if isinstance(user, dict):
            grantee = Grantee(user["sub"], user["tenant"], tuple(user["roles"]), tuple(user["groups"]))
        return Pending(str(claims["q"]), str(claims["csrf"]), grantee)

    def clear(self, response: Response) -> None:
        self._cookie.clear(response)


def csrf_ok(pending: Pending, given: object) -> bool:
    return isinstance(given, str) and secrets.compare_digest(given.encode(), pending.csrf.encode())
