"""OpenID Connect on Writ's authorization server: ID tokens beside the access token when a client asks
for the `openid` scope (authlib's `OpenIDCode` and `OpenIDToken` extensions of the code and refresh
grants), and the OpenID Provider Metadata that OpenID Connect Discovery 1.0 reads.

An ID token tells the client who signed in, nothing more: `sub` and the tenant (Writ names a principal
by both, and one subject may exist in two tenants), signed ES256 with the access tokens' current key
and `kid`, `aud` the client id, `iat`/`exp` by the server's clock (the access token's lifetime),
`auth_time`, the request's `nonce` (at the code exchange only: OIDC Core §12.2 as amended drops it on
refresh), and `at_hash`. Roles and groups stay out: they are what the resource decides on, they are in
the access token for the resource, and no OpenID scope asks for them.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from authlib.oauth2.rfc6749 import InvalidRequestError
from authlib.oidc.core import OpenIDCode, OpenIDToken, UserInfo
from joserfc.jwk import ECKey

from gateway.oauth.keys import ALGORITHM
from gateway.oauth.models import Client
from store.oauth import Grantee

if TYPE_CHECKING:
    from gateway.oauth.server import WritAuthorizationServer

OPENID = "openid"
NONCE_MAX = 255
"""The longest `nonce` taken (OIDC sets none; the store indexes it)."""
ID_TOKEN_CLAIMS = ["iss", "sub", "aud", "exp", "iat", "auth_time", "nonce", "at_hash"]


class _IdTokens:
    """What both extensions share: the key, the algorithm and the claims."""

    def __init__(self, server: WritAuthorizationServer) -> None:
        self.server = server

    def resolve_client_private_key(self, client: Client) -> ECKey:
        return self.server.keys.signing_key

    def get_client_algorithm(self, client: Client) -> str:
        return ALGORITHM  # the one the keys sign with; a client cannot choose another

    def get_encode_header(self, client: Client) -> dict[str, str]:
        return {"alg": ALGORITHM, "kid": self.server.keys.kid, "typ": "JWT"}

    def get_compatible_claims(self, request: Any) -> dict[str, Any]:
        """iss, aud, iat, exp and auth_time (the code's, or the refreshed family's)."""
        issued = int(self.server.now().timestamp())
        claims: dict[str, Any] = {
            "iss": self.server.settings.issuer,
            "aud": request.client.client_id,
            "iat": issued,
            "exp": issued + self.server.settings.access_token_ttl_s,
        }
        auth_time: datetime | None = getattr(request, "auth_time", None)
        if auth_time is not None:
            claims["auth_time"] = int(auth_time.timestamp())
        return claims

    def generate_user_info(self, user: Grantee, scope: str) -> UserInfo:
        info = UserInfo(sub=user.subject)
        tenant = self.server.settings.claims.tenant
        if tenant not in ID_TOKEN_CLAIMS:  # a mapping naming a standard claim must not overwrite it
            info[tenant] = user.tenant
        return info


class IdTokenAtCode(_IdTokens, OpenIDCode):  # type: ignore[misc]
    """The code grant's extension: a nonce is optional, echoed exactly, and refused when the client
    sent it before (a replayed authorization request)."""

    def __init__(self, server: WritAuthorizationServer) -> None:
        _IdTokens.__init__(self, server)
        OpenIDCode.__init__(self, require_nonce=False)

    def exists_nonce(self, nonce: str, request: Any) -> bool:
        return self.server.store.nonce_used(request.payload.client_id, nonce)

    def validate_openid_authorization_request(self, grant: Any, redirect_uri: str) -> None:
        nonce = grant.request.payload.data.get("nonce")
        if nonce and len(nonce) > NONCE_MAX:
            raise InvalidRequestError(f"nonce is longer than {NONCE_MAX} characters")
        if nonce and self.exists_nonce(nonce, grant.request):
            raise InvalidRequestError("this nonce was used before: send a new one with each request")


class IdTokenAtRefresh(_IdTokens, OpenIDToken):  # type: ignore[misc]
    """The refresh grant's extension: a new ID token for the same user and client (OIDC Core §12.2)."""


def provider_metadata(server: WritAuthorizationServer) -> dict[str, Any]:
    """OpenID Provider Metadata (OpenID Connect Discovery 1.0 §3): the RFC 8414 document, which names
    the same issuer and endpoints, with what an OpenID client needs besides."""
    document = server.metadata()
    return document | {
        "subject_types_supported": ["public"],
        "id_token_signing_alg_values_supported": [ALGORITHM],
        "claims_supported": list(dict.fromkeys([*ID_TOKEN_CLAIMS, server.settings.claims.tenant])),
        "claims_parameter_supported": False,
        "request_parameter_supported": False,
        "request_uri_parameter_supported": False,
    }
