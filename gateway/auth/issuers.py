"""Trusted token issuers: found by their metadata or an explicit `jwks_uri`, their keys cached.

A remote issuer's JWKS is fetched on first use and reused for `max_age_s`. A token whose `kid` is not
in the cached set causes a refetch, at most one per `min_refetch_s` however many made-up kids arrive,
so a key rotation at the issuer is picked up without a restart. A JWKS that cannot be fetched is an
`IssuerUnavailable`, logged with the URL and the cause: the token is refused, never accepted on a guess.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import anyio
import httpx2
from joserfc.errors import JoseError
from joserfc.jwk import KeySet

from gateway.errors import AuthenticationError

logger = logging.getLogger(__name__)

HttpFactory = Callable[[], httpx2.AsyncClient]
Clock = Callable[[], float]


class IssuerUnavailable(AuthenticationError):
    """An issuer's metadata, keys or introspection endpoint could not be used right now."""

    retryable = True


class KeySource(Protocol):
    async def key_set(self, kid: str | None) -> KeySet:
        """The keys to verify a token with this `kid` (None: the token names no key).

        Raises:
            IssuerUnavailable: no usable keys could be obtained.
        """
        ...


@dataclass(frozen=True, slots=True)
class StaticKeys:
    """Keys known in-process (the development issuer, tests)."""

    keys: KeySet

    async def key_set(self, kid: str | None) -> KeySet:
        return self.keys


@dataclass(frozen=True, slots=True)
class TrustedIssuer:
    """One issuer whose tokens this server accepts, with what its tokens must say."""

    issuer: str
    keys: KeySource | None
    audience: str | None = None
    """None: the verifier's default audience (this server's resource URL)."""
    algorithms: Sequence[str] | None = None
    introspector: Any = None
    """An `Introspector` for opaque tokens, when configured."""
    revoked: Callable[[Mapping[str, Any]], Awaitable[bool]] | None = None
    """Whether a verified token of this issuer was revoked since (asked on every use): Writ's own
    authorization server revokes a sign-in's access tokens with its refresh tokens."""


def metadata_urls(issuer: str) -> list[str]:
    """OpenID discovery first, then RFC 8414 (which puts the well-known part before the issuer's path)."""
    parts = urlsplit(issuer)
    origin = f"{parts.scheme}://{parts.netloc}"
    path = parts.path.rstrip("/")
    urls = [f"{issuer.rstrip('/')}/.well-known/openid-configuration"]
    urls.append(f"{origin}/.well-known/oauth-authorization-server{path}")
    return urls


async def fetch_json(http: HttpFactory, url: str, *, what: str) -> dict[str, Any]:
    """GET a JSON object.

    Raises:
        IssuerUnavailable: unreachable, not 200, or not a JSON object; the message names `what` and `url`.
    """
    try:
        async with http() as client:
            response = await client.get(url, headers={"Accept": "application/json"})
    except httpx2.HTTPError as exc:
        raise IssuerUnavailable(f"{what} at {url} is unreachable ({type(exc).__name__}: {exc})") from exc
    if response.status_code != 200:
        raise IssuerUnavailable(f"{what} at {url} answered HTTP {response.status_code}")
    try:
        body = response.json()
    except ValueError as exc:
        raise IssuerUnavailable(f"{what} at {url} is not JSON") from exc
    if not isinstance(body, dict):
        raise IssuerUnavailable(f"{what} at {url} is not a JSON object")
    return body


class IssuerMetadata:
    """The issuer's metadata document, fetched once; failures are retried at most every `retry_s`."""

    def __init__(self, issuer: str, *, http: HttpFactory, retry_s: float, clock: Clock) -> None:
        self._issuer = issuer
        self._http = http
        self._retry_s = retry_s
        self._clock = clock
        self._document: dict[str, Any] | None = None
        self._failure: tuple[float, IssuerUnavailable] | None = None
        self._lock = anyio.Lock()

    async def get(self) -> Mapping[str, Any]:
        """Raises: IssuerUnavailable: no metadata document answers for this issuer."""
        async with self._lock:
            if self._document is not None:
                return self._document
            if self._failure and self._clock() - self._failure[0] < self._retry_s:
                raise self._failure[1]
            problems: list[str] = []
            for url in metadata_urls(self._issuer):
                try:
                    document = await fetch_json(self._http, url, what="issuer metadata")
                except IssuerUnavailable as exc:
                    problems.append(str(exc))
                    continue
                if document.get("issuer") != self._issuer:
                    # RFC 8414 §3.3: metadata naming another issuer must not be used (mix-up attacks).
                    problems.append(f"{url} names issuer {document.get('issuer')!r}")
                    continue
                self._document = document
                return document
            failure = IssuerUnavailable(f"issuer {self._issuer}: no usable metadata ({'; '.join(problems)})")
            self._failure = (self._clock(), failure)
            raise failure


class RemoteKeys:
    """An issuer's JWKS over HTTP: cached, refetched when stale or when a token names an unknown kid."""

    def __init__(
        self,
        issuer: str,
        *,
        http: HttpFactory,
        jwks_uri: str | None = None,
        metadata: IssuerMetadata | None = None,
        max_age_s: float = 300.0,
        min_refetch_s: float = 30.0,
        clock: Clock = time.monotonic,
    ) -> None:
        if jwks_uri is None and metadata is None:
            raise ValueError("RemoteKeys needs a jwks_uri or the issuer's metadata")
        self._issuer = issuer
        self._http = http
        self._jwks_uri = jwks_uri
        self._metadata = metadata
        self._max_age_s = max_age_s
        self._min_refetch_s = min_refetch_s
        self._clock = clock
        self._keys: KeySet | None = None
        self._kids: frozenset[str] = frozenset()
        self._fetched_at = float("-inf")
        self._attempted_at = float("-inf")
        self._failure: IssuerUnavailable | None = None
        self._lock = anyio.Lock()

    async def key_set(self, kid: str | None) -> KeySet:
        keys = self._usable(kid)
        if keys is not None:
            return keys
        async with self._lock:
            # Another request may have refreshed the keys while this one waited.
            keys = self._usable(kid)
            return keys if keys is not None else await self._refresh()

    def _usable(self, kid: str | None) -> KeySet | None:
        now = self._clock()
        rate_limited = now - self._attempted_at < self._min_refetch_s
        if self._keys is None:
            if rate_limited and self._failure is not None:
                raise self._failure
            return None
        fresh = now - self._fetched_at < self._max_age_s
        known = kid is None or kid in self._kids
        if (fresh and known) or rate_limited:
            # Rate-limited with an unknown kid: decide with the keys we have (the token will fail).
            return self._keys
        return None

    async def _refresh(self) -> KeySet:
        self._attempted_at = self._clock()
        try:
            uri = self._jwks_uri or await self._uri_from_metadata()
            body = await fetch_json(self._http, uri, what="JWKS")
            keys = _signing_keys(body, uri)
        except IssuerUnavailable as exc:
            self._failure = exc
            if self._keys is not None and self._clock() - self._fetched_at < 2 * self._max_age_s:
                logger.error("issuer %s: %s; still using the keys fetched before", self._issuer, exc)
                return self._keys
            logger.error("issuer %s: %s; its tokens are refused until it answers", self._issuer, exc)
            raise
        self._keys, self._failure = keys, None
        self._kids = frozenset(k.kid for k in keys.keys if k.kid)
        self._fetched_at = self._clock()
        logger.info("issuer %s: %d signing keys from %s", self._issuer, len(keys.keys), uri)
        return keys

    async def _uri_from_metadata(self) -> str:
        assert self._metadata is not None
        uri = (await self._metadata.get()).get("jwks_uri")
        if not isinstance(uri, str) or not uri:
            raise IssuerUnavailable(f"issuer {self._issuer}: its metadata has no jwks_uri")
        return uri


def _signing_keys(body: Mapping[str, Any], uri: str) -> KeySet:
    keys = body.get("keys")
    if not isinstance(keys, list):
        raise IssuerUnavailable(f"JWKS at {uri} has no `keys` list")
    usable = [k for k in keys if isinstance(k, dict) and k.get("use", "sig") == "sig"]
    try:
        return KeySet.import_key_set({"keys": usable})
    except (JoseError, ValueError, TypeError) as exc:
        raise IssuerUnavailable(f"JWKS at {uri} holds a key that cannot be read: {exc}") from exc
