"""Writ's authorization server on authlib's server components, framework-neutral.

authlib is synchronous and this server's storage is the (blocking) store, so the HTTP face
(`gateway.oauth.routes`) reads each request whole, builds an `HttpRequest` from it and runs the
server in a worker thread; every answer comes back as an `Answer` for the face to send.
"""

from __future__ import annotations

import logging
import secrets
import uuid
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from authlib.oauth2 import AuthorizationServer
from authlib.oauth2.rfc6749 import InvalidClientError, InvalidScopeError, OAuth2Error
from authlib.oauth2.rfc6749.util import extract_basic_authorization
from joserfc import jwt
from joserfc.errors import JoseError

from gateway.audit.security import NoSecurityEvents, SecurityRefusal, SecuritySink, shown
from gateway.config import ClaimMapping
from gateway.oauth.documents import ClientDocuments, DocumentRefused, is_document_client_id
from gateway.oauth.endpoints import Registration, Revocation
from gateway.oauth.grants import AUTH_METHODS, AuthorizationCode, OneResource, RefreshToken, S256Only
from gateway.oauth.keys import ALGORITHM, SigningKeys
from gateway.oauth.login import AsSignedIn, KnownUsers
from gateway.oauth.models import Client
from gateway.oauth.openid import OPENID, IdTokenAtCode, IdTokenAtRefresh
from gateway.oauth.requests import Answer, HttpRequest
from store.oauth import CodeGrant, Grantee, GrantRefused, RefreshGrant
from store.ports import OAuthGrants

logger = logging.getLogger(__name__)

SOURCE: ContextVar[str | None] = ContextVar("writ_oauth_source", default=None)
"""The client address of the request the server is working on: the HTTP face sets it, and the worker
thread the server runs in sees it (anyio runs it in a copy of the context)."""


class DocumentClientError(InvalidClientError):  # type: ignore[misc]
    """The client id is a metadata document URL whose document cannot be used (noted as such, not as
    an unknown client)."""


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
    sign_in_max_age_s: int = 86400
    """A refresh of a sign-in older than this is refused: the person signs in again."""
    scopes: tuple[str, ...] = ()
    claims: ClaimMapping = field(default_factory=ClaimMapping)

    def url(self, path: str) -> str:
        return f"{self.base_url}{path}"


class WritAuthorizationServer(AuthorizationServer):  # type: ignore[misc]
    """Codes with PKCE S256 for one resource, rotated refresh tokens, ES256 access tokens, and ID
    tokens for the clients that ask for `openid`."""

    def __init__(
        self,
        settings: Settings,
        store: OAuthGrants,
        keys: SigningKeys,
        clock: Callable[[], datetime],
        documents: ClientDocuments | None = None,
        users: KnownUsers | None = None,
    ) -> None:
        super().__init__(scopes_supported=self.scopes_of(settings))
        self.settings = settings
        self.documents = documents
        """Client ID Metadata Documents, when accepted (`client_metadata_documents.enabled`)."""
        self.users: KnownUsers = users or AsSignedIn()
        """Who a refresh's user is now: the built-in login's configured users, else as signed in."""
        self.store = store
        self.keys = keys
        self.now = clock
        self.resource = OneResource(settings.resource)
        self.register_grant(AuthorizationCode, [S256Only(required=True), self.resource, IdTokenAtCode(self)])
        self.register_grant(RefreshToken, [IdTokenAtRefresh(self)])
        self.register_endpoint(Registration)
        self.register_endpoint(Revocation)
        self.security: SecuritySink = NoSecurityEvents()
        """Where refusals worth a security team's eye are noted (`security.oauth_refused`); the
        composition root sets the gateway's."""

    def note_refusal(
        self,
        kind: str,
        client_id: str | None,
        *,
        tenant: str | None = None,
        redirect_uri: str | None = None,
    ) -> None:
        """Count one `security.oauth_refused` of `kind`: never a code, token, verifier or secret, only
        the client id the request named, the tenant of the grant it touched and the redirect's host."""
        host = urlsplit(redirect_uri).hostname if redirect_uri else None
        self.security.note(
            SecurityRefusal(
                "security.oauth_refused",
                kind,
                SOURCE.get(),
                tenant=tenant,
                client_id=shown(client_id),
                redirect_host=shown(host),
            )
        )

    @staticmethod
    def scopes_of(settings: Settings) -> list[str]:
        """The scopes a client may ask for: the configured ones, and `openid` for an ID token."""
        return [*settings.scopes, *([] if OPENID in settings.scopes else [OPENID])]

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
            "scopes_supported": self.scopes_of(self.settings),
        }
        if self.documents is not None:
            document["client_id_metadata_document_supported"] = True
        return document

    # -- authlib's framework hooks ------------------------------------------------------------

    def query_client(self, client_id: str) -> Client | None:
        """A registered client, or the one a metadata document URL describes.

        Raises:
            InvalidClientError: the client id is a URL whose document cannot be used (saying why).
        """
        if is_document_client_id(client_id):
            if self.documents is None:
                raise InvalidClientError(
                    description="this server does not accept client metadata documents: register at /register"
                )
            try:
                return Client(self.documents.client(client_id))
            except DocumentRefused as exc:
                logger.warning("refused client metadata document: %s", exc)
                self.note_refusal("document_refused", client_id)
                raise DocumentClientError(description=str(exc)) from exc
        record = self.store.get_client(client_id)
        return Client(record) if record is not None else None

    def create_oauth2_request(self, request: Any) -> Any:
        return request  # the face built it already (`HttpRequest`)

    def create_json_request(self, request: Any) -> Any:
        return request

    def handle_response(self, status: int, body: Any, headers: Any) -> Answer:
        return Answer(status, body if isinstance(body, dict | str) else str(body), list(headers))

    def handle_error_response(self, request: Any, error: OAuth2Error) -> Answer:
        # /token and /revoke answer their errors here, with the request they refused.
        if request is not None and _unknown_client(error):
            self.note_refusal("invalid_client", _client_id_of(request))
        answer: Answer = super().handle_error_response(request, error)
        return answer

    def get_consent_grant(self, request: Any = None, end_user: Any = None) -> Any:
        # /authorize raises its errors for the HTTP face to answer (on a page or to the client).
        try:
            return super().get_consent_grant(request, end_user)
        except OAuth2Error as error:
            if _unknown_client(error):
                self.note_refusal("invalid_client", _client_id_of(request))
            raise

    def send_signal(self, name: str, *args: Any, **kwargs: Any) -> None:
        pass

    def validate_requested_scope(self, scope: str | None) -> None:
        # authlib lets any scope through when none is configured: here only `openid` is then allowed.
        if scope and not set(scope.split()) <= set(self.scopes_of(self.settings)):
            raise InvalidScopeError(f"scopes offered here: {' '.join(self.scopes_of(self.settings))}")

    # -- what the grants call -----------------------------------------------------------------

    def save_code(self, code: str, request: HttpRequest) -> None:
        user: Grantee = request.user
        now = self.now()
        data = request.payload.data
        scope = request.scope or " ".join(self.settings.scopes)
        self.store.issue_code(
            code,
            CodeGrant(
                family_id=uuid.uuid4().hex,
                client_id=request.client.client_id,
                redirect_uri=data.get("redirect_uri") or "",
                scope=scope,
                resource=self.settings.resource,
                code_challenge=data["code_challenge"],
                code_challenge_method=data["code_challenge_method"],
                grantee=user,
                expires_at=now + timedelta(seconds=self.settings.code_ttl_s),
                nonce=(data.get("nonce") or None) if OPENID in scope.split() else None,
                auth_time=now,  # Writ keeps no sign-in session: each authorization signs in afresh
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
        # It ends when it idles too long or when its sign-in is too old, whichever is nearer: so what
        # it is stored to end at (`writ oauth clients show`) is when a refresh stops working.
        idle_end = now + timedelta(seconds=self.settings.refresh_token_ttl_s)
        sign_in_end = (request.auth_time or now) + timedelta(seconds=self.settings.sign_in_max_age_s)
        self.store.issue_refresh_token(
            refresh,
            RefreshGrant(
                family_id=request.family_id,
                client_id=request.client.client_id,
                scope=str(token.get("scope", "")),
                resource=request.resource or self.settings.resource,
                grantee=request.user,
                issued_at=now,
                expires_at=min(idle_end, sign_in_end),
                auth_time=request.auth_time,
            ),
        )

    def refused(self, problem: GrantRefused, what: str, client_id: str, *, tenant: str | None) -> None:
        """A code or refresh token the store refused; the signs of theft are noted for security."""
        logger.warning("refused %s of client %s: %s (%s)", what, client_id, problem, problem.problem)
        if problem.problem == "reused":
            # Used before: the store has just revoked every token of its grant.
            kind = "code_replayed" if what == "authorization code" else "refresh_reused"
            self.note_refusal(kind, client_id, tenant=tenant)
        elif problem.problem == "revoked":
            # A grant ended by a revocation (of the principal, of the client, after a replay) still in use.
            self.note_refusal("grant_revoked", client_id, tenant=tenant)

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


def _unknown_client(error: OAuth2Error) -> bool:
    return isinstance(error, InvalidClientError) and not isinstance(error, DocumentClientError)


def _client_id_of(request: Any) -> str | None:
    """The client id a request named: in its form or query, else in its basic authorization."""
    if request is None:
        return None
    named = getattr(getattr(request, "payload", None), "client_id", None)
    if named:
        return str(named)
    try:
        basic_id, _ = extract_basic_authorization(request.headers)
    except ValueError:  # a header that is not UTF-8 names no client
        return None
    return str(basic_id) if basic_id else None
