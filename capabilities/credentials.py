"""Backend credentials: read once at startup from the environment or files, never from a client.

`Credentials` carries the headers an executor sends (or, for OAuth, the token source it asks before
each request) and can scrub its secret values out of any text (an exception message, a response
echo) before that text leaves the executor.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

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
        """`text` with every secret value, in each form a backend may echo it, replaced by ***."""
        return _masked(text, self._forms())

    def scrub_json(self, value: Any) -> Any:
        """`value` (JSON data) with every string and key scrubbed; its structure is left as it was."""
        forms = self._forms()

        def walk(item: Any) -> Any:
            if isinstance(item, str):
                return _masked(item, forms)
            if isinstance(item, Mapping):
                return {_masked(str(key), forms): walk(inner) for key, inner in item.items()}
            if isinstance(item, list | tuple):
                return [walk(inner) for inner in item]
            return item

        return walk(value) if forms else value

    def _forms(self) -> list[str]:
        # Asked per use: an OAuth token source's tokens change as it refreshes them.
        secrets = self.secrets + (self.tokens.secrets if self.tokens is not None else ())
        forms = {form for secret in secrets if secret for form in _forms(secret) if form}
        return sorted(forms, key=len, reverse=True)

    @classmethod
    def none(cls) -> Credentials:
        return cls(headers={})


def _masked(text: str, forms: list[str]) -> str:
    for form in forms:
        text = text.replace(form, _MASK)
    return text


_MIN_ENCODED = 8
"""Shorter base64 fragments are left alone: they would mask unrelated text, and reveal next to nothing."""


def _forms(secret: str) -> Iterator[str]:
    """The spellings of `secret` a backend's echo or an error may carry."""
    yield secret
    yield repr(secret)[1:-1]  # as Python quotes it: an exception prints `a\\nb` for `a<LF>b`
    escaped = json.dumps(secret, ensure_ascii=False)[1:-1]
    for json_form in {escaped, json.dumps(secret)[1:-1]}:
        yield json_form
        yield json_form.replace("/", "\\/")  # JSON may escape `/` (PHP and Java encoders do)
    yield quote(secret, safe="")
    yield quote(secret)  # `/` kept, as in a path
    yield quote_plus(secret)
    yield from _base64_forms(secret.encode("utf-8"))


def _base64_forms(raw: bytes) -> Iterator[str]:
    # Inside a longer encoded text (`user:secret`, a JSON document) the secret starts at any of three
    # offsets of a 3-byte group; the characters that depend on its bytes alone are the same at each.
    for offset in range(3):
        encoded = base64.b64encode(bytes(offset) + raw).decode("ascii")
        start = -(-8 * offset // 6)  # the first character without a bit of the padding before it
        end = 8 * (offset + len(raw)) // 6  # past the last character made of its bits alone
        inner = encoded[start:end]
        if len(inner) >= _MIN_ENCODED:
            yield inner
            yield inner.replace("+", "-").replace("/", "_")  # base64url
            yield quote(inner, safe="")  # base64 inside a query string


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
