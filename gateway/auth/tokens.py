"""Bearer token verification and the mapping from a verified token to a Principal."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from joserfc import jws, jwt
from joserfc.errors import (
    BadSignatureError,
    ExpiredTokenError,
    InvalidClaimError,
    InvalidKeyIdError,
    JoseError,
    MissingClaimError,
)
from mcp.server.auth.provider import AccessToken

from gateway.auth.issuers import IssuerUnavailable, TrustedIssuer
from gateway.config import ClaimMapping
from gateway.errors import AuthenticationError
from policy.model import Principal
from store.limits import NAME_CHARS, SUBJECT_CHARS, TENANT_CHARS, refusal

logger = logging.getLogger(__name__)

FORBIDDEN_ALGORITHMS = frozenset({"none", "HS256", "HS384", "HS512"})
VERIFIED_TTL_S = 60.0
"""How long a verified JWT is trusted without re-checking its signature (bounded by its exp)."""
VERIFIED_CACHE_SIZE = 10_000

__all__ = ["FORBIDDEN_ALGORITHMS", "ClaimsRejected", "JwtVerifier", "TrustedIssuer", "principal_from_claims"]


class Failure(NamedTuple):
    """A kind of token failure: `kind` for metrics and logs, `public` for the token's holder (a few
    words that name no key, URL or setting of this gateway's)."""

    kind: str
    public: str


EXPIRED = Failure("expired", "the token has expired")
ANOTHER_AUDIENCE = Failure("wrong_audience", "the token is for another resource (aud)")
UNTRUSTED_ISSUER = Failure("untrusted_issuer", "the token's issuer is not trusted here")
ISSUER_UNAVAILABLE = Failure(
    "issuer_unavailable", "the token's issuer could not be reached to check it; try again later"
)
MALFORMED = Failure("malformed", "the token is malformed")
REVOKED = Failure("revoked", "the token was revoked")
ALGORITHM = Failure("algorithm_not_allowed", "the token's signing algorithm is not accepted")
BAD_SIGNATURE = Failure("bad_signature", "the token's signature does not verify")
UNKNOWN_KEY = Failure("unknown_key", "the token's signing key (kid) is not one its issuer publishes")
INACTIVE = Failure("inactive", "the token is not active")


class Claimed(NamedTuple):
    """Who a refused token speaks for, known only when its issuer's signature verified (it expired, is
    for another audience, was revoked...): what a security event may name without taking a forger's
    word for it."""

    issuer: str
    subject: str | None
    tenant: str | None


class TokenRejected(AuthenticationError):
    """This token is not acceptable. The detail is logged; its holder hears `failure.public`."""

    def __init__(self, detail: str, failure: Failure = MALFORMED, claimed: Claimed | None = None) -> None:
        super().__init__(detail)
        self.failure = failure
        self.claimed = claimed

    @property
    def public(self) -> str:
        return self.failure.public

    @property
    def kind(self) -> str:
        return self.failure.kind


class ClaimsRejected(TokenRejected):
    """A token that verified, but whose claims Writ cannot act on or record (a tenant of 300
    characters, a subject with NUL). Its holder hears the whole detail: the issuer signed it, so the
    reason tells an operator what to fix and an attacker nothing about keys or issuers."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail, Failure("unusable_claims", detail))


class JwtVerifier:
    """Verifies access tokens: signature, `iss`, `aud` = this resource, `exp`/`nbf`, allowed `alg`.

    JWTs are checked against their issuer's keys; opaque tokens are introspected (RFC 7662) by the
    issuers configured for it. Implements the MCP SDK's `TokenVerifier` protocol: a token that fails
    any check, or whose issuer cannot be reached, is None (401) and the reason is logged; with
    `explain` it raises `TokenRejected`, whose `public` reason the HTTP edge tells the token's holder.
    """

    def __init__(
        self,
        issuers: Sequence[TrustedIssuer],
        *,
        audience: str,
        algorithms: Sequence[str],
        leeway_s: int = 30,
        claims: ClaimMapping | None = None,
    ) -> None:
        self._issuers = {i.issuer: i for i in issuers}
        self._claims = claims or ClaimMapping()
        self._audience = audience
        self._algorithms = allowed_algorithms(algorithms)
        self._leeway = leeway_s
        self._verified: OrderedDict[bytes, tuple[float, AccessToken]] = OrderedDict()

    @property
    def issuers(self) -> list[str]:
        return list(self._issuers)

    async def verify_token(self, token: str, *, explain: bool = False) -> AccessToken | None:
        """The verified token, or None with the reason logged (never the token itself).

        Raises:
            TokenRejected: with `explain`, for a token that is not acceptable, its `public` reason
                for its holder (`IssuerUnavailable` included: the issuer could not be asked).
        """
        try:
            return await self.check(token)
        except IssuerUnavailable as exc:
            logger.error("refused bearer token: %s", exc)
            if explain:
                raise TokenRejected(str(exc), ISSUER_UNAVAILABLE) from exc
        except TokenRejected as exc:
            logger.info("rejected bearer token (%s): %s", exc.kind, exc)
            if explain:
                raise
        return None

    async def check(self, token: str) -> AccessToken:
        """The verified token.

        Raises:
            ClaimsRejected: it verified, but a claim is of a shape or size Writ cannot use.
            TokenRejected: any other reason it is not acceptable.
            IssuerUnavailable: its issuer's keys or introspection could not be reached.
        """
        # A client sends the same token on every request: a verified JWT is remembered (by its
        # hash) for a short while, never past its `exp`, so the signature check is not redone.
        digest = hashlib.sha256(token.encode()).digest()
        remembered = self._verified.get(digest)
        if remembered is not None and remembered[0] > time.time():
            verified = remembered[1]
        else:
            verified = await self._verify(token)
        claims = verified.claims or {}
        issuer = self._issuers.get(str(claims.get("iss", "")))
        if issuer is not None and issuer.revoked is not None and await issuer.revoked(claims):
            raise TokenRejected("revoked at its issuer", REVOKED, self._claimed(issuer.issuer, claims))
        return verified

    def _claimed(self, issuer: str, claims: Mapping[str, Any]) -> Claimed:
        try:
            principal = principal_from_claims(claims, self._claims)
        except TokenRejected:  # a subject or tenant Writ cannot hold is not named either
            return Claimed(issuer, None, None)
        return Claimed(issuer, principal.subject, principal.tenant)

    def _remember(self, digest: bytes, token: AccessToken, until: float) -> None:
        self._verified[digest] = (until, token)
        self._verified.move_to_end(digest)
        while len(self._verified) > VERIFIED_CACHE_SIZE:
            self._verified.popitem(last=False)

    async def _verify(self, token: str) -> AccessToken:
        parsed = _unverified(token)
        if parsed is None:
            return await self._introspect(token)
        header, unverified = parsed
        issuer = self._issuers.get(str(unverified.get("iss", "")))
        if issuer is None or issuer.keys is None:
            raise TokenRejected("untrusted issuer", UNTRUSTED_ISSUER)
        algorithms = (
            allowed_algorithms(issuer.algorithms) if issuer.algorithms is not None else self._algorithms
        )
        if header.get("alg") not in algorithms:
            raise TokenRejected(
                f"algorithm {str(header.get('alg'))[:20]!r} is not allowed",
                ALGORITHM,
            )
        keys = await issuer.keys.key_set(header.get("kid") if isinstance(header.get("kid"), str) else None)
        try:
            decoded = jwt.decode(token, keys, algorithms=algorithms)
        except (JoseError, ValueError) as exc:
            raise TokenRejected(str(exc), _failure_of(exc)) from exc
        try:
            jwt.JWTClaimsRegistry(
                leeway=self._leeway,
                iss={"essential": True, "value": issuer.issuer},
                aud={"essential": True, "value": issuer.audience or self._audience},
                exp={"essential": True},
                sub={"essential": True},
            ).validate(decoded.claims)
        except (JoseError, ValueError) as exc:
            # The signature verified: the issuer vouches for who the token names, if not for its use here.
            claimed = self._claimed(issuer.issuer, decoded.claims)
            raise TokenRejected(str(exc), _failure_of(exc), claimed) from exc
        verified = self._access_token(token, decoded.claims)
        until = min(float(decoded.claims["exp"]), time.time() + VERIFIED_TTL_S)
        self._remember(hashlib.sha256(token.encode()).digest(), verified, until)
        return verified

    async def _introspect(self, token: str) -> AccessToken:
        introspectors = [i for i in self._issuers.values() if i.introspector is not None]
        if not introspectors or not token or len(token) > 4096 or not token.isprintable():
            raise TokenRejected("malformed (not a JWT, and no introspection configured)")
        for issuer in introspectors:
            claims = await issuer.introspector.introspect(token)
            if claims is None:
                continue
            claims = dict(claims)
            if claims.setdefault("iss", issuer.issuer) != issuer.issuer:
                raise TokenRejected("introspected token names another issuer", UNTRUSTED_ISSUER)
            audience = issuer.audience or self._audience
            aud = claims.get("aud")
            if aud is not None and audience not in ([aud] if isinstance(aud, str) else aud):
                raise TokenRejected("introspected token is for another audience", ANOTHER_AUDIENCE)
            if not isinstance(claims.get("exp"), int | float) or claims["exp"] + self._leeway < time.time():
                raise TokenRejected("introspected token has no future exp", EXPIRED)
            if not claims.get("sub"):
                raise TokenRejected(
                    "introspected token has no sub", Failure("missing_claim", "the token has no sub claim")
                )
            return self._access_token(token, claims)
        raise TokenRejected("inactive opaque token", INACTIVE)

    def _access_token(self, token: str, claims: Mapping[str, Any]) -> AccessToken:
        # A principal must come out of every accepted token: a claim of the wrong shape (roles: 5,
        # tenant: [...]) is refused here, with 401, not met later by each request as a crash.
        principal_from_claims(claims, self._claims)
        scope = claims.get("scope") or claims.get("scp") or ""
        if isinstance(scope, str):
            scopes = scope.split()
        elif isinstance(scope, list) and all(isinstance(s, str) for s in scope):
            scopes = list(scope)
        else:
            raise ClaimsRejected("claim 'scope' is not a string or a list of strings")
        return AccessToken(
            token=token,
            client_id=str(claims.get("client_id") or claims.get("azp") or ""),
            scopes=scopes,
            # When this gateway stops taking it: `exp` and the leeway. The SDK's bearer backend checks
            # `expires_at` again, and given the bare `exp` it refused a token in its leeway with a
            # bare 401, before the verifier could say why 30 s later.
            expires_at=int(claims["exp"]) + self._leeway,
            resource=self._audience,
            subject=str(claims["sub"]),
            claims=dict(claims),
        )


def _failure_of(exc: Exception) -> Failure:
    """The kind of a failed JWT check, from joserfc's error types."""
    if isinstance(exc, ExpiredTokenError):
        return EXPIRED
    if isinstance(exc, BadSignatureError):
        return BAD_SIGNATURE
    if isinstance(exc, InvalidKeyIdError):
        return UNKNOWN_KEY
    if isinstance(exc, MissingClaimError):
        return Failure("missing_claim", f"the token has no {exc.claim} claim")
    if isinstance(exc, InvalidClaimError):  # joserfc's InvalidTokenError is this class too
        if exc.claim == "aud":
            return ANOTHER_AUDIENCE
        if exc.claim in ("nbf", "iat"):
            return Failure("not_yet_valid", "the token is not valid yet")
        return Failure("invalid_claim", f"the token's {exc.claim} claim is not accepted")
    return MALFORMED


def allowed_algorithms(algorithms: Sequence[str]) -> list[str]:
    """`algorithms` without those never accepted (`none`, HS*: FORBIDDEN_ALGORITHMS)."""
    return [a for a in algorithms if a not in FORBIDDEN_ALGORITHMS]


def _unverified(token: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """Header and claims of a compact JWS, unverified (to pick issuer and key); None if not a JWS."""
    if token.count(".") != 2:
        return None
    try:
        extracted = jws.extract_compact(token.encode())
        claims = json.loads(extracted.payload)
    except (JoseError, ValueError) as exc:
        raise TokenRejected(f"malformed ({type(exc).__name__})") from exc
    if not isinstance(claims, dict):
        raise TokenRejected("malformed (claims are not an object)")
    return dict(extracted.protected), claims


def principal_from_claims(claims: Mapping[str, Any], mapping: ClaimMapping) -> Principal:
    """Build the Principal a verified token speaks for, through the configured claim names.

    Raises:
        ClaimsRejected: a claim it needs is missing, of the wrong shape, or one the store cannot hold
            (store.limits).
    """
    subject = claims.get(mapping.subject)
    if not isinstance(subject, str) or not subject:
        raise ClaimsRejected(f"claim {mapping.subject!r} (the subject) is missing or not a string")
    _fits(subject, f"claim {mapping.subject!r} (the subject)", SUBJECT_CHARS)
    tenant = claims.get(mapping.tenant)
    if tenant is not None and not isinstance(tenant, str):
        raise ClaimsRejected(f"claim {mapping.tenant!r} (the tenant) is not a string")
    if tenant:
        _fits(tenant, f"claim {mapping.tenant!r} (the tenant)", TENANT_CHARS)
    client_id = claims.get(mapping.client_id) or claims.get("azp")
    if client_id is not None and not isinstance(client_id, str):
        raise ClaimsRejected(f"claim {mapping.client_id!r} (the client id) is not a string")
    if client_id:
        _fits(client_id, f"claim {mapping.client_id!r} (the client id)", NAME_CHARS)
    return Principal(
        subject=subject,
        tenant=tenant or mapping.default_tenant,
        roles=_strings(claims.get(mapping.roles), mapping.roles),
        groups=_strings(claims.get(mapping.groups), mapping.groups),
        scopes=_strings(claims.get(mapping.scopes) or claims.get("scp"), mapping.scopes),
        client_id=client_id or None,
    )


def _fits(value: str, what: str, limit: int) -> None:
    message = refusal(what, value, limit)
    if message is not None:
        raise ClaimsRejected(message)


def _strings(value: Any, claim: str) -> frozenset[str]:
    """A claim holding names: a space- or comma-separated string, or a list of strings.

    Raises:
        ClaimsRejected: anything else (a number, an object, a list holding other things), or a name
            the store cannot hold.
    """
    if value is None:
        return frozenset()
    if isinstance(value, str):
        names = frozenset(value.replace(",", " ").split())
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        names = frozenset(v for v in value if v)
    else:
        raise ClaimsRejected(f"claim {claim!r} is not a string or a list of strings")
    for name in names:
        _fits(name, f"a name in claim {claim!r}", NAME_CHARS)
    return names
