"""Backend credentials: read once at startup from the environment or files, never from a client.

`Credentials` carries the headers an executor sends (or, for OAuth, the token source it asks before
each request) and can scrub its secret values out of any text (an exception message, a response
echo) before that text leaves the executor.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from capabilities.config import AuthConfig, BasicAuth, BearerAuth, HeaderAuth, OAuth2ClientCredentialsAuth
from capabilities.contract import ConfigError
from capabilities.oauth_tokens import ClientCredentialsTokens, TokenSource

_MASK = "***"


@dataclass(frozen=True, slots=True)
class Credentials:
    """Resolved secrets of one backend: headers to send, and the raw values to scrub."""

    headers: Mapping[str, str]
    secrets: tuple[str, ...] = ()
    tokens: TokenSource | None = None
    """Set for OAuth: the `Authorization` header comes from here, per request."""

    def scrub(self, text: str) -> str:
        """`text` with every secret value (and its base64 and header forms) replaced by ***."""
        secrets = self.secrets + (self.tokens.secrets if self.tokens is not None else ())
        # Also as Python escapes it: an exception quoting a value prints `a\\nb` for `a<LF>b`.
        forms = {form for secret in secrets if secret for form in (secret, repr(secret)[1:-1]) if form}
        for form in sorted(forms, key=len, reverse=True):
            text = text.replace(form, _MASK)
        return text

    @classmethod
    def none(cls) -> Credentials:
        return cls(headers={})


def read_secret(
    *, env: str | None, file: str | None, owner: str, environ: Mapping[str, str], base_dir: Path | None
) -> str:
    """One secret from an environment variable or a file (relative to `base_dir`).

    Raises:
        ConfigError: naming the variable or file, never the value.
    """
    if env is not None:
        value = environ.get(env)
        if not value:
            raise ConfigError(f"{owner}: environment variable {env} is not set or empty")
        return value
    assert file is not None
    path = Path(file)
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    try:
        value = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(
            f"{owner}: cannot read secret file {path} ({exc.strerror or type(exc).__name__})"
        ) from None
    if not value:
        raise ConfigError(f"{owner}: secret file {path} is empty")
    return value


def resolve_credentials(
    auth: AuthConfig | None,
    *,
    owner: str,
    environ: Mapping[str, str],
    base_dir: Path | None = None,
) -> Credentials:
    """Turn an `auth:` block into headers.

    Raises:
        ConfigError: a variable or file is missing.
    """
    if auth is None:
        return Credentials.none()
    if isinstance(auth, OAuth2ClientCredentialsAuth):
        secret = read_secret(
            env=auth.client_secret_env,
            file=auth.client_secret_file,
            owner=owner,
            environ=environ,
            base_dir=base_dir,
        )
        tokens = ClientCredentialsTokens(
            owner,
            token_url=auth.token_url,
            client_id=auth.client_id,
            client_secret=secret,
            scope=auth.scope,
            audience=auth.audience,
            resource=auth.resource,
            auth_method=auth.auth_method,
            timeout_s=auth.timeout_s,
            refresh_margin_s=auth.refresh_margin_s,
        )
        return Credentials(headers={}, secrets=(secret,), tokens=tokens)
    if isinstance(auth, BearerAuth | HeaderAuth):
        token = read_secret(
            env=auth.token_env, file=auth.token_file, owner=owner, environ=environ, base_dir=base_dir
        )
        if any(c in token for c in "\r\n\0"):
            # No header can carry it: httpx2 refused every request, quoting the value in its error.
            where = f"environment variable {auth.token_env}" if auth.token_env else f"file {auth.token_file}"
            raise ConfigError(f"{owner}: the secret in {where} holds a line break or NUL (one line expected)")
        if isinstance(auth, BearerAuth):
            return Credentials(headers={"Authorization": f"Bearer {token}"}, secrets=(token,))
        return Credentials(headers={auth.header: token}, secrets=(token,))
    assert isinstance(auth, BasicAuth)
    if auth.username is not None:
        username = auth.username
    else:
        username = read_secret(
            env=auth.username_env, file=None, owner=owner, environ=environ, base_dir=base_dir
        )
    password = read_secret(
        env=auth.password_env, file=auth.password_file, owner=owner, environ=environ, base_dir=base_dir
    )
    encoded = base64.b64encode(f"{username}:{password}".encode()).decode("ascii")
    return Credentials(headers={"Authorization": f"Basic {encoded}"}, secrets=(password, encoded))


def resolve_env(
    env_from: Mapping[str, str], *, owner: str, environ: Mapping[str, str]
) -> tuple[dict[str, str], tuple[str, ...]]:
    """Child environment entries copied from the host environment, and their values as secrets.

    Raises:
        ConfigError: a host variable is missing.
    """
    resolved = {
        child: read_secret(env=host, file=None, owner=owner, environ=environ, base_dir=None)
        for child, host in env_from.items()
    }
    return resolved, tuple(resolved.values())
