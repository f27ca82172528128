"""Bearer token verification and the mapping from a verified token to a Principal."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from joserfc import jws, jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet
from mcp.server.auth.provider import AccessToken

from gateway.config import ClaimMapping
from policy.model import Principal

logger = logging.getLogger(__name__)

FORBIDDEN_ALGORITHMS = frozenset({"none", "HS256", "HS384", "HS512"})


@dataclass(frozen=True, slots=True)
class TrustedIssuer:
    issuer: str
    keys: KeySet


class JwtVerifier:
    """Verifies JWT access tokens: signature, `iss`, `aud` = this resource, `exp`/`nbf`, allowed `alg`.

    Implements the MCP SDK's `TokenVerifier` protocol; a token that fails any check is None (401).
    """

    def __init__(
        self,
        issuers: Sequence[TrustedIssuer],
        *,
        audience: str,
        algorithms: Sequence[str],
        leeway_s: int = 30,
    ) -> None:
        self._issuers = {i.issuer: i for i in issuers}
        self._audience = audience
        self._algorithms = [a for a in algorithms if a not in FORBIDDEN_ALGORITHMS]
        self._leeway = leeway_s

    async def verify_token(self, token: str) -> AccessToken | None:
        return self.verify(token)

    def verify(self, token: str) -> AccessToken | None:
        """The verified token, or None with the reason logged (never the token itself)."""
        try:
            unverified = json.loads(jws.extract_compact(token.encode()).payload)
        except (JoseError, ValueError) as exc:
            logger.info("rejected bearer token: malformed (%s)", type(exc).__name__)
            return None
        issuer = self._issuers.get(str(unverified.get("iss", ""))) if isinstance(unverified, dict) else None
        if issuer is None:
            logger.info("rejected bearer token: untrusted issuer")
            return None
        try:
            decoded = jwt.decode(token, issuer.keys, algorithms=self._algorithms)
            jwt.JWTClaimsRegistry(
                leeway=self._leeway,
                iss={"essential": True, "value": issuer.issuer},
                aud={"essential": True, "value": self._audience},
                exp={"essential": True},
                sub={"essential": True},
            ).validate(decoded.claims)
        except (JoseError, ValueError) as exc:
            logger.info("rejected bearer token: %s", exc)
            return None
        claims = decoded.claims
        scope = claims.get("scope") or claims.get("scp") or ""
        scopes = scope.split() if isinstance(scope, str) else [str(s) for s in scope]
        return AccessToken(
            token=token,
            client_id=str(claims.get("client_id") or claims.get("azp") or ""),
            scopes=scopes,
            expires_at=int(claims["exp"]),
            resource=self._audience,
            subject=str(claims["sub"]),
            claims=dict(claims),
        )


def principal_from_claims(claims: Mapping[str, Any], mapping: ClaimMapping) -> Principal:
    """Build the Principal a verified token speaks for, through the configured claim names."""

    def strings(value: Any) -> frozenset[str]:
        if value is None:
            return frozenset()
        if isinstance(value, str):
            return frozenset(value.replace(",", " ").split())
        return frozenset(str(v) for v in value)

    return Principal(
        subject=str(claims[mapping.subject]),
        tenant=str(claims.get(mapping.tenant) or mapping.default_tenant),
        roles=strings(claims.get(mapping.roles)),
        groups=strings(claims.get(mapping.groups)),
        scopes=strings(claims.get(mapping.scopes) or claims.get("scp")),
        client_id=(str(claims[mapping.client_id]) if claims.get(mapping.client_id) else claims.get("azp")),
    )
