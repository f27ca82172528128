"""Access tokens Writ gets for itself to call a backend: the OAuth 2.0 client credentials grant.

One `ClientCredentialsTokens` per backend caches its token and fetches a new one shortly before it
expires; a lock makes concurrent calls share one fetch. The request is built with authlib's RFC 6749
helpers and sent with httpx2 (authlib's own httpx integration needs `httpx`, which Writ does not use).
Neither the client secret nor a token ever appears in an error message: a failure names the endpoint
and the HTTP status or OAuth error code only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
import httpx2
from authlib.oauth2.auth import ClientAuth
from authlib.oauth2.rfc6749.parameters import prepare_token_request

from capabilities.contract import BackendUnavailable

DEFAULT_LIFETIME_S = 300.0
"""How long a token without `expires_in` is reused (a backend's 401 drops it sooner)."""
_KEEP_ISSUED = 4


class TokenUnavailable(BackendUnavailable):
    """No access token could be obtained; nothing was sent to the backend."""


class TokenSource(Protocol):
    """Where an executor gets the `Authorization` value for its next request."""

    @property
    def secrets(self) -> tuple[str, ...]: ...

    async def authorization(self) -> str:
        """Raises: TokenUnavailable."""
        ...

    def invalidate(self, authorization: str) -> None: ...


@dataclass(frozen=True, slots=True)
class _Token:
    value: str
    refresh_at: float


class ClientCredentialsTokens:
    """A cached access token from one token endpoint, refreshed before it expires."""

    def __init__(
        self,
        owner: str,
        *,
        token_url: str,
        client_id: str,
        client_secret: str,
        scope: str | list[str] | None = None,
        audience: str | None = None,
        resource: str | None = None,
        auth_method: str = "client_secret_basic",
        timeout_s: float = 10.0,
        refresh_margin_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        transport: httpx2.AsyncBaseTransport | None = None,
    ) -> None:
        self._owner = owner
        self._token_url = token_url
        self._client_auth = ClientAuth(client_id, client_secret, auth_method)
        extra = {"scope": scope, "audience": audience, "resource": resource}
        self._params = {key: value for key, value in extra.items() if value}
        self._timeout_s = timeout_s
        self._margin_s = refresh_margin_s
        self._clock = clock
        self._transport = transport
        self._token: _Token | None = None
        self._issued: list[str] = []
        self._lock = anyio.Lock()

    @property
    def secrets(self) -> tuple[str, ...]:
        """The client secret and the tokens issued lately: what an executor must scrub from text."""
        return (self._client_auth.client_secret, *self._issued)

    async def authorization(self) -> str:
        """`Bearer <token>`, from the cache or a fresh fetch.

        Raises:
            TokenUnavailable: the token endpoint could not be reached or gave no usable token.
        """
        token = self._token
        if token is not None and self._clock() < token.refresh_at:
            return f"Bearer {token.value}"
        async with self._lock:
            token = self._token
            if token is None or self._clock() >= token.refresh_at:
                token = self._token = await self._fetch()
        return f"Bearer {token.value}"

    def invalidate(self, authorization: str) -> None:
        """Forget the cached token if it is the one in `authorization` (the backend refused it)."""
        token = self._token
        if token is not None and authorization == f"Bearer {token.value}":
            self._token = None

    async def _fetch(self) -> _Token:
        where = f"{self._owner}: token endpoint {self._token_url}"
        body = prepare_token_request("client_credentials", **self._params)
        headers = {"Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json"}
        _, headers, body = self._client_auth.prepare("POST", self._token_url, headers, body)
        started = self._clock()
        try:
            with anyio.fail_after(self._timeout_s):
                async with httpx2.AsyncClient(
                    timeout=self._timeout_s, follow_redirects=False, transport=self._transport
                ) as client:
                    response = await client.post(self._token_url, content=body, headers=headers)
        except TimeoutError:
            raise TokenUnavailable(f"{where} did not answer within {self._timeout_s:g}s") from None
        except httpx2.HTTPError as exc:
            raise TokenUnavailable(f"{where} is unreachable ({type(exc).__name__})") from None
        payload = _json_object(response)
        if response.status_code != 200:
            error = payload.get("error") if isinstance(payload.get("error"), str) else None
            code = f", error {error[:64]}" if error else ""
            raise TokenUnavailable(f"{where} answered HTTP {response.status_code}{code}")
        value = payload.get("access_token")
        token_type = payload.get("token_type", "Bearer")
        if not isinstance(value, str) or not value:
            raise TokenUnavailable(f"{where} answered without an access_token")
        if not isinstance(token_type, str) or token_type.lower() != "bearer":
            raise TokenUnavailable(f"{where} issued a token of type {str(token_type)[:32]!r}, not Bearer")
        lifetime = _lifetime(payload.get("expires_in"))
        margin = min(self._margin_s, lifetime / 2)
        self._issued = [value, *self._issued][:_KEEP_ISSUED]
        return _Token(value, refresh_at=started + lifetime - margin)


def _lifetime(expires_in: Any) -> float:
    try:
        lifetime = float(expires_in)
    except (TypeError, ValueError):
        return DEFAULT_LIFETIME_S
    return lifetime if lifetime > 0 else 0.0


def _json_object(response: httpx2.Response) -> Mapping[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
