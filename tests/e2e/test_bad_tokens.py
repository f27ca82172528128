"""The running `writ serve` in front of a real OAuth server: every kind of bad token is refused with 401
and the resource-metadata challenge, and nothing reaches the backend; good RS256/ES256 tokens work."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx2
import pytest
from joserfc import jwt
from joserfc.jwk import ECKey, OctKey

from tests.e2e.harness import Backend, Gateway, writ_gateway
from tests.gateway.auth.oauth_process import AuthServer, auth_server

pytestmark = [pytest.mark.e2e]

SCOPE = "writ.tools"
REFUND = {"order_id": "1001", "amount": 20, "currency": "EUR", "reason": "damaged in transit"}


@pytest.fixture
def oauth() -> Iterator[AuthServer]:
    with auth_server("http://unused.example/mcp") as server:
        yield server


@pytest.fixture
def guarded(tmp_path: Path, backend: Backend, oauth: AuthServer) -> Iterator[Gateway]:
    auth = {
        "issuers": [{"issuer": oauth.issuer}],
        "required_scopes": [SCOPE],
        "jwks_min_refetch_s": 0,
    }
    with writ_gateway(tmp_path, backend, f"sqlite:///{tmp_path / 'writ.db'}", auth=auth) as gateway:
        yield gateway


def call_refund(gateway: Gateway, token: str | None) -> httpx2.Response:
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "refund_order", "arguments": REFUND},
    }
    return httpx2.post(gateway.mcp_url, json=body, headers=headers, timeout=10)


async def refund(gateway: Gateway, token: str, key: str) -> str:
    """A refund through the official MCP client; the call's status."""
    async with gateway.client(token) as client:
        result = await client.call_tool("refund_order", REFUND, meta={"writ/idempotencyKey": key})
    return result.meta["writ/status"]


def b64(data: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


def assert_refused(gateway: Gateway, response: httpx2.Response) -> None:
    assert response.status_code == 401, response.text
    challenge = response.headers["www-authenticate"]
    assert challenge.startswith("Bearer ")
    assert f'resource_metadata="{gateway.url}/.well-known/oauth-protected-resource/mcp"' in challenge


def test_every_kind_of_bad_token_is_refused_with_401_and_nothing_is_dispatched(
    guarded: Gateway, backend: Backend, oauth: AuthServer
) -> None:
    aud, now = guarded.mcp_url, int(time.time())
    good = oauth.token("agent-es", scope=SCOPE, resource=aud)
    header, payload, signature = good.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    jwks = httpx2.get(f"{oauth.issuer}/jwks.json", timeout=5).json()["keys"]
    foreign = ECKey.generate_key("P-256", auto_kid=True)
    bad = {
        "none": None,
        "garbage": "garbage.garbage.garbage",
        "alg none": f"{b64({'alg': 'none', 'typ': 'JWT'})}.{b64(claims)}.",
        "HS256 with the public key": jwt.encode(
            {"alg": "HS256", "kid": jwks[1]["kid"]}, claims, OctKey.import_key(json.dumps(jwks[1]).encode())
        ),
        "foreign key": jwt.encode({"alg": "ES256", "kid": jwks[1]["kid"]}, claims, foreign),
        "unknown kid": jwt.encode({"alg": "ES256", "kid": foreign.kid}, claims, foreign),
        "tampered payload": f"{header}.{b64(claims | {'roles': ['admin'], 'tenant': 'globex'})}.{signature}",
        "expired": oauth.mint(aud=aud, scope=SCOPE, sub="a", iat=now - 7200, nbf=now - 7200, exp=now - 3600),
        "not yet valid": oauth.mint(aud=aud, scope=SCOPE, sub="a", nbf=now + 3600, exp=now + 7200),
        "wrong issuer": oauth.mint(aud=aud, scope=SCOPE, sub="a", iss="https://evil.example"),
        "wrong audience": oauth.token("agent-es", scope=SCOPE, resource="https://other.example/mcp"),
    }
    for name, token in bad.items():
        response = call_refund(guarded, token)
        assert response.status_code == 401, f"{name}: {response.status_code} {response.text}"
        assert_refused(guarded, response)
    assert backend.refunds() == []
    assert guarded.exported() == ""

    # The control: the same gateway does dispatch for a good token of either algorithm.
    for n, client in enumerate(("agent-es", "agent-rs")):
        assert (
            anyio.run(refund, guarded, oauth.token(client, scope=SCOPE, resource=aud), f"k{n}") == "completed"
        )
    assert len(backend.refunds()) == 2


def test_a_token_without_the_required_scope_gets_403_naming_the_scope(
    guarded: Gateway, backend: Backend, oauth: AuthServer
) -> None:
    response = call_refund(guarded, oauth.token("agent-es", resource=guarded.mcp_url))
    assert response.status_code == 403
    assert 'error="insufficient_scope"' in response.headers["www-authenticate"]
    assert response.json()["error_description"] == f"Required scope: {SCOPE}"
    assert backend.refunds() == []


def test_protected_resource_metadata_lists_every_trusted_issuer(guarded: Gateway, oauth: AuthServer) -> None:
    for path in ("/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp"):
        metadata = httpx2.get(guarded.url + path, timeout=5).json()
        servers = [s.rstrip("/") for s in metadata["authorization_servers"]]
        assert servers == [f"{guarded.url}/dev-issuer", oauth.issuer]
        assert metadata["resource"] == guarded.mcp_url and metadata["scopes_supported"] == [SCOPE]


def test_a_key_rotation_at_the_issuer_is_picked_up_without_a_restart(
    guarded: Gateway, oauth: AuthServer
) -> None:
    before = oauth.token("agent-rs", scope=SCOPE, resource=guarded.mcp_url)
    assert anyio.run(refund, guarded, before, "before") == "completed"
    oauth.rotate_keys()
    rotated = oauth.token("agent-rs", scope=SCOPE, resource=guarded.mcp_url)
    assert anyio.run(refund, guarded, rotated, "after") == "completed"


def test_a_jwks_endpoint_that_is_down_refuses_tokens_and_says_so_in_the_log(
    guarded: Gateway, backend: Backend, oauth: AuthServer
) -> None:
    oauth.set_jwks_status(503)
    response = call_refund(guarded, oauth.token("agent-es", scope=SCOPE, resource=guarded.mcp_url))
    assert_refused(guarded, response)
    assert backend.refunds() == []
    log = (guarded.workdir / "writ.log").read_text()
    assert f"JWKS at {oauth.issuer}/jwks.json answered HTTP 503" in log
    assert "its tokens are refused until it answers" in log
