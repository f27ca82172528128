"""Trusted issuers against a real OAuth server process: discovery, JWKS caching, rotation, outages,
opaque tokens through introspection."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from joserfc import jwt
from joserfc.jwk import ECKey

from gateway.auth.issuers import IssuerMetadata, IssuerUnavailable, RemoteKeys, metadata_urls
from gateway.auth.tokens import JwtVerifier, principal_from_claims
from gateway.auth.trust import trusted_issuers
from gateway.config import AuthConfig, ClaimMapping, IssuerConfig
from gateway.errors import ConfigurationError
from tests.gateway.auth.oauth_process import AuthServer, auth_server

pytestmark = pytest.mark.anyio

AUD = "http://127.0.0.1:8080/mcp"
SECRET_ENV = {"INTROSPECT_SECRET": "introspect-secret-6"}


@pytest.fixture(scope="module")
def server() -> Iterator[AuthServer]:
    with auth_server(AUD) as s:
        yield s


def verifier_for(server: AuthServer, **issuer: Any) -> JwtVerifier:
    settings = {k: issuer.pop(k) for k in ("jwks_max_age_s", "jwks_min_refetch_s") if k in issuer}
    auth = AuthConfig(issuers=[IssuerConfig(issuer=server.issuer, **issuer)], **settings)
    return JwtVerifier(
        trusted_issuers(auth, None, environ=SECRET_ENV), audience=AUD, algorithms=auth.algorithms
    )


async def test_rs256_and_es256_tokens_from_client_credentials_verify_through_discovery(
    server: AuthServer,
) -> None:
    verifier = verifier_for(server)
    for client in ("agent-rs", "agent-es"):
        token = await verifier.verify_token(server.token(client, scope="writ.tools"))
        assert token is not None and token.subject == client and token.scopes == ["writ.tools"]
        principal = principal_from_claims(token.claims or {}, ClaimMapping())
        assert principal.tenant == "acme" and principal.roles == {"agent"} and principal.client_id == client


async def test_an_explicit_jwks_uri_works_without_discovery(server: AuthServer) -> None:
    verifier = verifier_for(server, discovery=False, jwks_uri=f"{server.issuer}/jwks.json")
    assert await verifier.verify_token(server.token("agent-es")) is not None


async def test_a_token_for_another_resource_is_refused(server: AuthServer) -> None:
    verifier = verifier_for(server)
    assert await verifier.verify_token(server.token("agent-es", resource="https://other.example/mcp")) is None
    assert await verifier.verify_token(server.token("agent-es", resource=AUD)) is not None


async def test_a_per_issuer_algorithm_list_refuses_other_algorithms(server: AuthServer) -> None:
    verifier = verifier_for(server, algorithms=["ES256"])
    assert await verifier.verify_token(server.token("agent-es")) is not None
    assert await verifier.verify_token(server.token("agent-rs")) is None


async def test_rotated_keys_are_picked_up_without_a_restart(server: AuthServer) -> None:
    verifier = verifier_for(server, jwks_min_refetch_s=0)
    assert await verifier.verify_token(server.token("agent-rs")) is not None
    fetches = server.jwks_fetches()
    server.rotate_keys()
    assert await verifier.verify_token(server.token("agent-rs")) is not None
    assert await verifier.verify_token(server.token("agent-es")) is not None
    assert server.jwks_fetches() == fetches + 1


async def test_unknown_kids_cause_at_most_one_refetch_per_interval(server: AuthServer) -> None:
    verifier = verifier_for(server, jwks_min_refetch_s=600)
    assert await verifier.verify_token(server.token("agent-es")) is not None
    fetches = server.jwks_fetches()
    for _ in range(20):
        foreign = ECKey.generate_key("P-256", auto_kid=True)
        claims = {"iss": server.issuer, "aud": AUD, "sub": "mallory", "exp": 2**31}
        assert (
            await verifier.verify_token(jwt.encode({"alg": "ES256", "kid": foreign.kid}, claims, foreign))
            is None
        )
    assert server.jwks_fetches() == fetches


async def test_a_jwks_endpoint_that_is_down_refuses_tokens_with_a_clear_logged_error(
    server: AuthServer, caplog: pytest.LogCaptureFixture
) -> None:
    verifier = verifier_for(server, jwks_min_refetch_s=0)
    token = server.token("agent-es")
    server.set_jwks_status(503)
    try:
        with caplog.at_level(logging.ERROR, logger="gateway"):
            assert await verifier.verify_token(token) is None
        assert f"JWKS at {server.issuer}/jwks.json answered HTTP 503" in caplog.text
        assert "refused" in caplog.text
    finally:
        server.set_jwks_status(200)
    assert await verifier.verify_token(token) is not None


async def test_an_unreachable_issuer_refuses_tokens(caplog: pytest.LogCaptureFixture) -> None:
    from tests.e2e.harness import free_port

    issuer = f"http://127.0.0.1:{free_port()}"
    auth = AuthConfig(issuers=[IssuerConfig(issuer=issuer)])
    verifier = JwtVerifier(trusted_issuers(auth, None, environ={}), audience=AUD, algorithms=["ES256"])
    key = ECKey.generate_key("P-256", auto_kid=True)
    token = jwt.encode(
        {"alg": "ES256", "kid": key.kid}, {"iss": issuer, "aud": AUD, "sub": "a", "exp": 2**31}, key
    )
    with caplog.at_level(logging.ERROR, logger="gateway"):
        assert await verifier.verify_token(token) is None
    assert f"issuer {issuer}: no usable metadata" in caplog.text and "unreachable" in caplog.text


async def test_opaque_tokens_are_introspected_and_cached_briefly(server: AuthServer) -> None:
    introspection = {"client_id": "writ-introspect", "client_secret_env": "INTROSPECT_SECRET", "cache_s": 60}
    cached = verifier_for(server, introspection=introspection)
    uncached = verifier_for(server, introspection=introspection | {"cache_s": 0})
    opaque = server.token("agent-opaque", scope="writ.tools")
    assert "." not in opaque
    for verifier in (cached, uncached):
        token = await verifier.verify_token(opaque)
        assert token is not None and token.subject == "agent-opaque" and token.scopes == ["writ.tools"]
    server.revoke_opaque(opaque)
    assert await cached.verify_token(opaque) is not None
    assert await uncached.verify_token(opaque) is None
    assert await uncached.verify_token("not-a-token-the-issuer-knows") is None


async def test_introspection_with_a_wrong_client_secret_refuses_and_logs(
    server: AuthServer, caplog: pytest.LogCaptureFixture
) -> None:
    auth = AuthConfig(
        issuers=[
            IssuerConfig(
                issuer=server.issuer,
                introspection={"client_id": "writ-introspect", "client_secret_env": "WRONG"},
            )
        ]
    )
    verifier = JwtVerifier(
        trusted_issuers(auth, None, environ={"WRONG": "nope"}), audience=AUD, algorithms=["ES256"]
    )
    with caplog.at_level(logging.ERROR, logger="gateway"):
        assert await verifier.verify_token(server.token("agent-opaque")) is None
    assert "introspection at" in caplog.text and "HTTP 401" in caplog.text
    assert "nope" not in caplog.text


async def test_without_introspection_an_opaque_token_is_refused(server: AuthServer) -> None:
    assert await verifier_for(server).verify_token(server.token("agent-opaque")) is None


def test_metadata_urls_try_openid_discovery_then_rfc_8414() -> None:
    assert metadata_urls("https://id.example/tenant1") == [
        "https://id.example/tenant1/.well-known/openid-configuration",
        "https://id.example/.well-known/oauth-authorization-server/tenant1",
    ]


async def test_rfc_8414_metadata_is_used_when_openid_discovery_is_absent() -> None:
    issuer = "https://as.example/t1"
    seen: list[str] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(str(request.url))
        if str(request.url) == "https://as.example/.well-known/oauth-authorization-server/t1":
            return httpx2.Response(200, json={"issuer": issuer, "jwks_uri": "https://as.example/keys"})
        return httpx2.Response(404)

    metadata = IssuerMetadata(
        issuer,
        http=lambda: httpx2.AsyncClient(transport=httpx2.MockTransport(handler)),
        retry_s=0,
        clock=lambda: 0,
    )
    assert (await metadata.get())["jwks_uri"] == "https://as.example/keys"
    assert seen[0].endswith("/t1/.well-known/openid-configuration")


async def test_metadata_naming_another_issuer_is_not_used() -> None:
    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(
            200, json={"issuer": "https://evil.example", "jwks_uri": "https://evil.example/k"}
        )

    http = lambda: httpx2.AsyncClient(transport=httpx2.MockTransport(handler))  # noqa: E731
    keys = RemoteKeys(
        "https://as.example",
        http=http,
        metadata=IssuerMetadata("https://as.example", http=http, retry_s=0, clock=lambda: 0),
    )
    with pytest.raises(IssuerUnavailable, match="names issuer 'https://evil.example'"):
        await keys.key_set("k1")


def test_an_issuer_without_any_way_to_find_its_keys_is_a_configuration_error() -> None:
    with pytest.raises(ValueError, match="set jwks_uri, discovery: true, or introspection"):
        IssuerConfig(issuer="https://as.example", discovery=False)
    twice = AuthConfig(issuers=[IssuerConfig(issuer="https://a.example")] * 2)
    with pytest.raises(ConfigurationError, match="listed twice"):
        trusted_issuers(twice, None, environ={})
