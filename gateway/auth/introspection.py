"""Opaque access tokens, checked by asking their issuer (RFC 7662 token introspection).

Answers are cached briefly, keyed by a hash of the token (the token itself is never kept or logged),
and never past the token's own `exp`: a revoked token stops working within `cache_s`.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx2

from gateway.auth.issuers import Clock, HttpFactory, IssuerUnavailable

logger = logging.getLogger(__name__)

MAX_ENTRIES = 10_000


class Introspector:
    """Asks one issuer's introspection endpoint whether a token is active, as a confidential client."""

    def __init__(
        self,
        issuer: str,
        *,
        endpoint: Callable[[], Awaitable[str]],
        client_id: str,
        client_secret: str,
        http: HttpFactory,
        cache_s: float = 30.0,
        clock: Clock = time.time,
    ) -> None:
        self.issuer = issuer
        self._endpoint = endpoint
        self._auth = (client_id, client_secret)
        self._http = http
        self._cache_s = cache_s
        self._clock = clock
        self._cache: dict[str, tuple[float, dict[str, Any] | None]] = {}

    async def introspect(self, token: str) -> dict[str, Any] | None:
        """The token's claims when the issuer says it is active, else None.

        Raises:
            IssuerUnavailable: the endpoint could not be asked or gave no usable answer.
        """
        digest = hashlib.sha256(token.encode()).hexdigest()
        now = self._clock()
        cached = self._cache.get(digest)
        if cached is not None and cached[0] > now:
            return cached[1]
        url = await self._endpoint()
        try:
            async with self._http() as client:
                response = await client.post(
                    url,
                    data={"token": token, "token_type_hint": "access_token"},
                    auth=self._auth,
                    headers={"Accept": "application/json"},
                )
        except httpx2.HTTPError as exc:
            raise IssuerUnavailable(
                f"introspection at {url} is unreachable ({type(exc).__name__}: {exc})"
            ) from exc
        if response.status_code != 200:
            raise IssuerUnavailable(f"introspection at {url} answered HTTP {response.status_code}")
        try:
            body = response.json()
        except ValueError as exc:
            raise IssuerUnavailable(f"introspection at {url} did not answer JSON") from exc
        if not isinstance(body, dict):
            raise IssuerUnavailable(f"introspection at {url} did not answer a JSON object")
        claims = body if body.get("active") is True else None
        until = now + self._cache_s
        if claims is not None and isinstance(claims.get("exp"), int | float):
            until = min(until, float(claims["exp"]))
        self._remember(digest, until, claims)
        return claims

    def _remember(self, digest: str, until: float, claims: dict[str, Any] | None) -> None:
        if len(self._cache) >= MAX_ENTRIES:
            now = self._clock()
            self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
            if len(self._cache) >= MAX_ENTRIES:
                self._cache.clear()
        self._cache[digest] = (until, claims)
