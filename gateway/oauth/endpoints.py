"""The endpoints beside the grants: RFC 7591 registration and RFC 7009 revocation."""

from __future__ import annotations

import logging
import secrets
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from authlib.oauth2.rfc7009 import RevocationEndpoint
from authlib.oauth2.rfc7591 import (
    ClientRegistrationEndpoint,
    InvalidClientMetadataError,
    InvalidRedirectURIError,
)

from gateway.oauth.grants import AUTH_METHODS
from gateway.oauth.keys import ALGORITHM
from gateway.oauth.models import Client, Token, is_loopback
from gateway.reasons import ReasonCode
from store.oauth import RegisteredClient, digest

if TYPE_CHECKING:
    from gateway.oauth.server import WritAuthorizationServer

logger = logging.getLogger(__name__)


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
        # OpenID Connect Registration §2: ID tokens are RS256 unless the client is told otherwise, and
        # they are ES256 here (the signing keys are EC), so the answer says so; another is refused.
        asked = request.payload.data.get("id_token_signed_response_alg")
        if asked not in (None, ALGORITHM):
            raise InvalidClientMetadataError(f"ID tokens are signed with {ALGORITHM} here, not {asked}")
        metadata["id_token_signed_response_alg"] = ALGORITHM
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
