"""The store's OAuth records as authlib's grants and endpoints read them (its client and token mixins).

authlib ships no type information, hence the `type: ignore[misc]` on each subclass.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from authlib.oauth2.rfc6749 import ClientMixin, TokenMixin
from authlib.oidc.core import AuthorizationCodeMixin

from store.oauth import CodeGrant, RefreshGrant, RegisteredClient, digest


def is_loopback(uri: str) -> bool:
    """An `http` URI on the loopback interface (RFC 8252 §7.3: a native app's redirect)."""
    return urlsplit(uri).scheme == "http" and on_loopback(uri)


def on_loopback(url: str) -> bool:
    """Whether `url`'s host is this machine, whatever its scheme."""
    host = urlsplit(url).hostname
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def same_redirect(registered: str, given: str) -> bool:
    """Exact match, except that a loopback redirect may use any port (RFC 8252 §7.3)."""
    if registered == given:
        return True
    if not (is_loopback(registered) and is_loopback(given)):
        return False
    a, b = urlsplit(registered), urlsplit(given)
    return (a.scheme, a.hostname, a.path, a.query) == (b.scheme, b.hostname, b.path, b.query)


class Client(ClientMixin):  # type: ignore[misc]
    """A client registered through /register."""

    def __init__(self, record: RegisteredClient) -> None:
        self.record = record
        self.client_id = record.client_id

    @property
    def metadata(self) -> Mapping[str, Any]:
        return self.record.metadata

    @property
    def name(self) -> str:
        """What the consent page calls it: its self-declared `client_name`, else its id."""
        name = self.metadata.get("client_name")
        return name if isinstance(name, str) and name.strip() else self.client_id

    @property
    def document_host(self) -> str | None:
        """For a client known by its metadata document: the host publishing it (who vouches for the
        name); None for a registered client."""
        if self.record.document_fresh_until is None:
            return None
        return urlsplit(self.client_id).hostname

    @property
    def redirect_uris(self) -> list[str]:
        return [str(u) for u in self.metadata.get("redirect_uris", [])]

    def get_client_id(self) -> str:
        return self.client_id

    def get_default_redirect_uri(self) -> str | None:
        uris = self.redirect_uris
        return uris[0] if len(uris) == 1 else None

    def get_allowed_scope(self, scope: str | None) -> str:
        if not scope:
            return ""
        registered = self.metadata.get("scope")
        allowed = set(str(registered).split()) if registered else None
        return " ".join(s for s in scope.split() if allowed is None or s in allowed)

    def check_redirect_uri(self, redirect_uri: str) -> bool:
        return any(same_redirect(registered, redirect_uri) for registered in self.redirect_uris)

    def check_client_secret(self, client_secret: str) -> bool:
        expected = self.record.secret_hash
        return expected is not None and hmac.compare_digest(digest(client_secret), expected)

    def check_endpoint_auth_method(self, method: str, endpoint: str) -> bool:
        return bool(method == self.metadata.get("token_endpoint_auth_method", "client_secret_basic"))

    def check_response_type(self, response_type: str) -> bool:
        return response_type in self.metadata.get("response_types", ["code"])

    def check_grant_type(self, grant_type: str) -> bool:
        return grant_type in self.metadata.get("grant_types", ["authorization_code"])


@dataclass
class Code(AuthorizationCodeMixin):  # type: ignore[misc]
    """An authorization code presented at /token (the code itself, to redeem it, and its grant)."""

    code: str
    grant: CodeGrant

    @property
    def resource(self) -> str:
        return self.grant.resource

    @property
    def code_challenge(self) -> str:
        return self.grant.code_challenge

    @property
    def code_challenge_method(self) -> str:
        return self.grant.code_challenge_method

    def get_redirect_uri(self) -> str:
        return self.grant.redirect_uri

    def get_scope(self) -> str:
        return self.grant.scope

    def get_nonce(self) -> str | None:
        return self.grant.nonce

    def get_auth_time(self) -> int | None:
        moment = self.grant.auth_time
        return None if moment is None else int(moment.timestamp())


@dataclass
class Token(TokenMixin):  # type: ignore[misc]
    """A refresh token (presented at /token or /revoke) or an access token (at /revoke)."""

    value: str
    family_id: str
    client_id: str
    scope: str
    resource: str

    @classmethod
    def of_refresh(cls, value: str, grant: RefreshGrant) -> Token:
        return cls(value, grant.family_id, grant.client_id, grant.scope, grant.resource)

    def check_client(self, client: Client) -> bool:
        return bool(client.client_id == self.client_id)

    def get_scope(self) -> str:
        return self.scope

    def get_expires_in(self) -> int:
        return 0

    def is_expired(self) -> bool:
        return False  # the store refuses an expired refresh token when it is used

    def is_revoked(self) -> bool:
        return False  # likewise for a revoked family
