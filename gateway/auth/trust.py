"""Which issuers this server trusts, built from the `auth:` section (called by the composition root)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

import httpx2

from capabilities.contract import ConfigError
from capabilities.credentials import read_secret
from gateway.auth.dev_issuer import DevIssuer
from gateway.auth.introspection import Introspector
from gateway.auth.issuers import (
    HttpFactory,
    IssuerMetadata,
    IssuerUnavailable,
    RemoteKeys,
    StaticKeys,
    TrustedIssuer,
)
from gateway.config import AuthConfig, IssuerConfig
from gateway.errors import ConfigurationError


def http_factory(timeout_s: float) -> HttpFactory:
    """A fresh client per fetch: fetches are rare (cached, rate-limited) and no client outlives a loop."""
    return lambda: httpx2.AsyncClient(timeout=timeout_s, follow_redirects=False)


def trusted_issuers(
    auth: AuthConfig,
    dev_issuer: DevIssuer | None,
    *,
    environ: Mapping[str, str],
    base_dir: Path | None = None,
    http: HttpFactory | None = None,
) -> list[TrustedIssuer]:
    """The dev issuer (when enabled) and every configured issuer, ready to verify tokens.

    Raises:
        ConfigurationError: an issuer is listed twice, or an introspection secret is missing.
    """
    http = http or http_factory(auth.http_timeout_s)
    issuers = [TrustedIssuer(dev_issuer.issuer, StaticKeys(dev_issuer.public_keys))] if dev_issuer else []
    for config in auth.issuers:
        if any(i.issuer == config.issuer for i in issuers):
            raise ConfigurationError(f"auth.issuers: {config.issuer} is listed twice")
        issuers.append(_remote(config, auth, environ=environ, base_dir=base_dir, http=http))
    return issuers


def _remote(
    config: IssuerConfig,
    auth: AuthConfig,
    *,
    environ: Mapping[str, str],
    base_dir: Path | None,
    http: HttpFactory,
) -> TrustedIssuer:
    metadata = (
        IssuerMetadata(config.issuer, http=http, retry_s=auth.jwks_min_refetch_s, clock=time.monotonic)
        if config.discovery
        else None
    )
    keys = (
        RemoteKeys(
            config.issuer,
            http=http,
            jwks_uri=config.jwks_uri,
            metadata=metadata,
            max_age_s=auth.jwks_max_age_s,
            min_refetch_s=auth.jwks_min_refetch_s,
        )
        if config.jwks_uri or metadata
        else None
    )
    introspector = None
    if (spec := config.introspection) is not None:
        try:
            secret = read_secret(
                env=spec.client_secret_env,
                file=spec.client_secret_file,
                owner=f"auth.issuers[{config.issuer}].introspection",
                environ=environ,
                base_dir=base_dir,
            )
        except ConfigError as exc:
            raise ConfigurationError(str(exc)) from exc
        introspector = Introspector(
            config.issuer,
            endpoint=_endpoint(spec.endpoint, metadata, config.issuer),
            client_id=spec.client_id,
            client_secret=secret,
            http=http,
            cache_s=spec.cache_s,
        )
    return TrustedIssuer(
        config.issuer,
        keys,
        audience=config.audience,
        algorithms=config.algorithms,
        introspector=introspector,
    )


def _endpoint(
    explicit: str | None, metadata: IssuerMetadata | None, issuer: str
) -> Callable[[], Awaitable[str]]:
    async def endpoint() -> str:
        if explicit:
            return explicit
        assert metadata is not None
        url = (await metadata.get()).get("introspection_endpoint")
        if not isinstance(url, str) or not url:
            raise IssuerUnavailable(f"issuer {issuer}: its metadata has no introspection_endpoint")
        return url

    return endpoint
