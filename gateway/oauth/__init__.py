"""Writ's own OAuth authorization server for MCP clients (DESIGN §5, §7; issue 12).

`server` runs the protocol on authlib's components, `grants` the code and refresh grants, `keys` the
signing keys, `routes` the HTTP face, `signin` and `login` the browser's way through login and
consent; `oidc_login` and `upstream` the login through upstream OpenID providers. The composition
root (`gateway.app`) builds them from `auth.authorization_server`.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import AnyHttpUrl

from gateway.config import WritConfig
from gateway.errors import ConfigurationError
from gateway.oauth.models import is_loopback, on_loopback
from gateway.oauth.server import Settings


def issuer_of(base_url: str) -> str:
    """The issuer identifier as MCP clients compare it: the URL as pydantic renders it (a root URL
    with its trailing slash), so metadata, tokens and the redirect's `iss` all say the same."""
    return str(AnyHttpUrl(base_url))


def settings_for(config: WritConfig) -> Settings:
    """The authorization server's settings from the configuration.

    Raises:
        ConfigurationError: the public URL is plain http on another host than loopback (OAuth needs TLS);
            or the built-in login, which asks no password, would be served off loopback unasked.
    """
    server = config.server
    base = server.base_url
    if urlsplit(base).scheme != "https" and not is_loopback(base):
        raise ConfigurationError(
            f"auth.authorization_server needs an https server.public_url (or a loopback one), not {base}"
        )
    section = config.auth.authorization_server
    login = section.login
    if login is not None and login.type == "builtin" and not login.remote and not on_loopback(base):
        raise ConfigurationError(
            f"auth.authorization_server.login: the built-in login signs in anyone who reaches it as any "
            f"listed user and asks no password, so it serves only a loopback server.public_url, not {base}; "
            "sign people in through your identity provider, or set login.remote: true for a trial behind "
            "access control of your own"
        )
    scopes = section.scopes if section.scopes is not None else config.auth.required_scopes
    return Settings(
        issuer=issuer_of(base),
        base_url=base,
        resource=server.resource_url,
        access_token_ttl_s=section.access_token_ttl_s,
        refresh_token_ttl_s=section.refresh_token_ttl_s,
        code_ttl_s=section.code_ttl_s,
        sign_in_max_age_s=section.sign_in_max_age_s,
        scopes=tuple(scopes),
        claims=config.auth.claims,
    )
