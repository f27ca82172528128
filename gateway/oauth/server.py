"""Writ's authorization server on authlib's server components, framework-neutral.

authlib is synchronous and this server's storage is the (blocking) store, so the HTTP face
(`gateway.oauth.routes`) reads each request whole, builds an `HttpRequest` from it and runs the
server in a worker thread; every answer comes back as an `Answer` for the face to send.
"""

from __future__ import annotations

import json
import logging
import secrets
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from authlib.oauth2 import AuthorizationServer
from authlib.oauth2.rfc6749 import InvalidScopeError, OAuth2Payload, OAuth2Request
from authlib.oauth2.rfc6749.requests import JsonPayload, JsonRequest
from authlib.oauth2.rfc7009 import RevocationEndpoint
from authlib.oauth2.rfc7591 import ClientRegistrationEndpoint, InvalidRedirectURIError
from joserfc import jwt
from joserfc.errors import JoseError

from gateway.config import ClaimMapping
from gateway.oauth.grants import AUTH_METHODS, AuthorizationCode, OneResource, RefreshToken, S256Only
from gateway.oauth.keys import ALGORITHM, SigningKeys
from gateway.oauth.models import Client, Token, is_loopback
from gateway.reasons import ReasonCode
from store.oauth import CodeGrant, Grantee, GrantRefused, RefreshGrant, RegisteredClient, digest
from store.ports import OAuthGrants

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Settings:
    """What the server needs of the configuration, resolved."""

    issuer: str
    """As RFC 8414 clients compare it: the base URL as pydantic renders it (`http://host:port/`)."""
    base_url: str
    resource: str
    access_token_ttl_s: int
    refresh_token_ttl_s: int
    code_ttl_s: int
    scopes: tuple[str, ...] = ()
    claims: ClaimMapping = field(default_factory=ClaimMapping)

    def url(self, path: str) -> str:
        return f"{self.base_url}{path}"


@dataclass(frozen=True, slots=True)
class Answer:
    """An HTTP answer of the server: status, body (a JSON object or text) and headers."""

    status: int
    body: Mapping[str, Any] | str
    headers: Sequence[tuple[str, str]]

    @property
    def location(self) -> str | None:
        return next((v for k, v in self.headers if k.lower() == "location"), None)


class _Payload(OAuth2Payload):  # type: ignore[misc]
    def __init__(self, pairs: Sequence[tuple[str, str]]) -> None:
        self._data: dict[str, str] = {}
        self._datalist: dict[str, list[str]] = {}
        for key, value in pairs:
            self._data.setdefault(key, value)
            self._datalist.setdefault(key, []).append(value)

    @property
    def data(self) -> dict[str, str]:
        return self._data

    @property
    def datalist(self) -> dict[str, list[str]]:
        return self._datalist


class HttpRequest(OAuth2Request):  # type: ignore[misc]
    """A request read whole: its query and form parameters, and its headers."""

    def __init__(
        self,
        method: str,
        uri: str,
        headers: Mapping[str, str],
        query: Sequence[tuple[str, str]] = (),
        form: Sequence[tuple[str, str]] = (),
    ) -> None:
        super().__init__(method, uri, headers=headers)
        self._args = dict(reversed(query))  # the first value wins, as in the payload
        self._form = dict(reversed(form))
        self.payload = _Payload([*query, *form])
        self.family_id: str | None = None
        self.resource: str | None = None

    @property
    def args(self) -> dict[str, str]:
        return self._args

    @property
    def form(self) -> dict[str, str]:
        return self._form


class _JsonPayload(JsonPayload):  # type: ignore[misc]
    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    @property
    def data(self) -> dict[str, Any]:
        return self._data


class HttpJsonRequest(JsonRequest):  # type: ignore[misc]
    def __init__(self, method: str, uri: str, headers: Mapping[str, str], body: dict[str, Any]) -> None:
        super().__init__(method, uri, headers)
        self.payload = _JsonPayload(body)


def redirect_problem(uri: str) -> str | None:
    """Why a redirect URI may not be registered, or None: https anywhere, http on loopback only."""
    parts = urlsplit(uri)
    if parts.fragment or "#" in uri:
        return f"{uri}: a redirect URI has no fragment"
    if parts.scheme == "https" and parts.hostname:
        return None
    if is_loopback(uri):
        return None
    return f"{uri}: a redirect URI must be https, or http on loopback (127.0.0.1, [::1], localhost)"


class Registration(ClientRegistrationEndpoint):  # type: ignore[misc]
    """RFC 7591 dynamic registration, open to anyone (the face rate-limits it per client address)."""

    server: WritAuthorizationServer

    def authenticate_token(self, request: Any) -> bool:
        return True

    def get_server_metadata(self) -> dict[str, Any]:
        return self.server.metadata()

    def extract_client_metadata(self, request: Any) -> dict[str, Any]:
        metadata: dict[str, Any] = super().extract_client_metadata(request)
        uris = metadata.get("redirect_uris")
        if not uris:
            raise InvalidRedirectURIError("redirect_uris is required (the authorization code flow)")
        for uri in uris:
            if (problem := redirect_problem(str(uri))) is not None:
                raise InvalidRedirectURIError(problem)
        # RFC 7591 §2's defaults, written out so the client reads what it got.
        metadata.setdefault("token_endpoint_auth_method", "client_secret_basic")
        metadata.setdefault("grant_types", ["authorization_code"])
        metadata.setdefault("response_types", ["code"])
        return metadata

    def generate_client_secret(self, request: Any) -> str | None:
        method = request.payload.data.get("token_endpoint_auth_method", "client_secret_basic")
        return None if method == "none" else secrets.token_urlsafe(32)

    def save_client(
        self, client_info: dict[str, Any], client_metadata: dict[str, Any], request: Any
    ) -> Client:
        secret = client_info.get("client_secret")
        record = RegisteredClient(
            client_id=client_info["client_id"],
            metadata=client_metadata,
            issued_at=self.server.now(),
            secret_hash=digest(secret) if secret else None,
        )
        self.server.store.register_client(record)
        logger.info("registered OAuth client %s (%s)", record.client_id, client_metadata.get("client_name"))
        return Client(record)

    def create_registration_response(self, request: Any) -> tuple[int, dict[str, Any], Any]:
        status, body, headers = super().create_registration_response(request)
        return status, {k: v for k, v in body.items() if v is not None}, headers


class Revocation(RevocationEndpoint):  # type: ignore[misc]
    """RFC 7009: revoking a refresh token or an access token ends the whole sign-in it belongs to."""

    CLIENT_AUTH_METHODS = AUTH_METHODS
    server: WritAuthorizationServer

    def query_token(self, token_string: str, token_type_hint: str | None) -> Token | None:
        found = self.server.store.find_refresh_token(token_string)
        if found is not None:
            return Token.of_refresh(token_string, found)
        claims = self.server.own_access_token(token_string)
        if claims is None:
            return None
        return Token(
            token_string, str(claims["sid"]), str(claims["client_id"]), str(claims.get("scope", "")), ""
        )

    def revoke_token(self, token: Token, request: Any) -> None:
        if self.server.store.revoke_family(
            token.family_id, reason=ReasonCode.TOKEN_REVOKED, now=self.server.now()
        ):
            logger.info("client %s revoked sign-in %s", token.client_id, token.family_id)


class WritAuthorizationServer(AuthorizationServer):  # type: ignore[misc]
    """Codes with PKCE S256 for one resource, rotated refresh tokens, ES256 access tokens."""

    def __init__(
        self, settings: Settings, store: OAuthGrants, keys: SigningKeys, clock: Callable[[], datetime]
    ) -> None:
        super().__init__(scopes_supported=list(settings.scopes))
        self.settings = settings
        self.store = store
        self.keys = keys
        self.now = clock
        self.resource = OneResource(settings.resource)
        self.register_grant(AuthorizationCode, [S256Only(required=True), self.resource])
        self.register_grant(RefreshToken)
        self.register_endpoint(Registration)
        self.register_endpoint(Revocation)

    def metadata(self) -> dict[str, Any]:
        """RFC 8414 authorization server metadata."""
        url = self.settings.url
        document: dict[str, Any] = {
            "issuer": self.settings.issuer,
            "authorization_endpoint": url("/authorize"),
            "token_endpoint": url("/token"),
            "registration_endpoint": url("/register"),
            "revocation_endpoint": url("/revoke"),
            "jwks_uri": url("/jwks.json"),
            "response_types_supported": ["code"],
            "response_modes_supported": ["query"],
            "grant_types_supported": ["authorization_code", "refresh_token"],
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": AUTH_METHODS,
            "revocation_endpoint_auth_methods_supported": AUTH_METHODS,
            "authorization_response_iss_parameter_supported": True,
        }
        if self.settings.scopes:
            document["scopes_supported"] = list(self.settings.scopes)
        return document

    # -- authlib's framework hooks ------------------------------------------------------------

    def query_client(self, client_id: str) -> Client | None:
        record = self.store.get_client(client_id)
        return Client(record) if record is not None else None

    def create_oauth2_request(self, request: Any) -> Any:
        return request  # the face built it already (`HttpRequest`)

    def create_json_request(self, request: Any) -> Any:
        return request

    def handle_response(self, status: int, body: Any, headers: Any) -> Answer:
        return Answer(status, body if isinstance(body, dict | str) else str(body), list(headers))

    def send_signal(self, name: str, *args: Any, **kwargs: Any) -> None:
        pass

    def validate_requested_scope(self, scope: str | None) -> None:
        # authlib lets any scope through when none is configured: here none is then allowed.
        if scope and not set(scope.split()) <= set(self.settings.scopes):
            raise InvalidScopeError(f"scopes offered here: {' '.join(self.settings.scopes) or 'none'}")

    # -- what the grants call -----------------------------------------------------------------

    def save_code(self, code: str, request: HttpRequest) -> None:
        user: Grantee = request.user
        now = self.now()
        data = request.payload.data
        self.store.issue_code(
            code,
            CodeGrant(
                family_id=uuid.uuid4().hex,
                client_id=request.client.client_id,
                redirect_uri=data.get("redirect_uri") or "",
                scope=request.scope or " ".join(self.settings.scopes),
                resource=self.settings.resource,
                code_challenge=data["code_challenge"],
                code_challenge_method=data["code_challenge_method"],
                grantee=user,
                expires_at=now + timedelta(seconds=self.settings.code_ttl_s),
            ),
            now=now,
        )

    def mint(
        self, request: HttpRequest, user: Grantee, scope: str, *, include_refresh_token: bool
    ) -> dict[str, Any]:
        """The token response: an ES256 access token for the resource, and a new refresh token."""
        issued = int(self.now().timestamp())
        ttl = self.settings.access_token_ttl_s
        mapping = self.settings.claims
        claims: dict[str, Any] = {
            "iss": self.settings.issuer,
            "sub": user.subject,
            "aud": self.settings.resource,
            "iat": issued,
            "nbf": issued,
            "exp": issued + ttl,
            "jti": uuid.uuid4().hex,
            "client_id": request.client.client_id,
            "sid": request.family_id,
            mapping.subject: user.subject,
            mapping.tenant: user.tenant,
            mapping.roles: list(user.roles),
            mapping.client_id: request.client.client_id,
        }
        if user.groups:
            claims[mapping.groups] = list(user.groups)
        if scope:
            claims[mapping.scopes] = scope
        token: dict[str, Any] = {
            "token_type": "Bearer",
            "access_token": self.keys.sign(claims),
            "expires_in": ttl,
        }
        if scope:
            token["scope"] = scope
        if include_refresh_token:
            token["refresh_token"] = secrets.token_urlsafe(32)
        return token

    def save_token(self, token: dict[str, Any], request: HttpRequest) -> None:
        refresh = token.get("refresh_token")
        if not refresh:
            return
        assert request.family_id is not None
        now = self.now()
        self.store.issue_refresh_token(
            refresh,
            RefreshGrant(
                family_id=request.family_id,
                client_id=request.client.client_id,
                scope=str(token.get("scope", "")),
                resource=request.resource or self.settings.resource,
                grantee=request.user,
                issued_at=now,
                expires_at=now + timedelta(seconds=self.settings.refresh_token_ttl_s),
            ),
        )

    def refused(self, problem: GrantRefused, what: str, client_id: str) -> None:
        logger.warning("refused %s of client %s: %s (%s)", what, client_id, problem, problem.problem)

    def own_access_token(self, token: str) -> dict[str, Any] | None:
        """The claims of an access token this server signed (expired or not), else None."""
        try:
            decoded = jwt.decode(token, self.keys.public_keys, algorithms=[ALGORITHM])
        except (JoseError, ValueError):
            return None
        claims = dict(decoded.claims)
        if claims.get("iss") != self.settings.issuer or not claims.get("sid") or not claims.get("client_id"):
            return None
        return claims


def answer_json(answer: Answer) -> bytes:
    return json.dumps(answer.body).encode() if isinstance(answer.body, Mapping) else answer.body.encode()
