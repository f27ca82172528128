"""The real gateway in front of a real OAuth server, in-process (`tests/gateway/mcp/inproc.py`): every
kind of bad token is refused with 401 and the resource-metadata challenge, and nothing reaches the
backend; good RS256/ES256 tokens work."""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx2
import pytest
from joserfc import jwt
from joserfc.jwk import ECKey, OctKey

from gateway.audit.security import SecurityEvents
from tests.gateway.auth.oauth_process import AuthServer
from tests.gateway.mcp.inproc import Backend, Writ, acme, oauth, writ

SCOPE = "writ.tools"
ALGORITHM = "the token's signing algorithm is not accepted"
SIGNATURE = "the token's signature does not verify"
REFUND = {"order_id": "1001", "amount": 20, "currency": "EUR", "reason": "damaged in transit"}


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[Backend]:
    with acme(tmp_path) as b:
        yield b


@pytest.fixture
def auth_server() -> Iterator[AuthServer]:
    with oauth("http://unused.example/mcp") as server:
        yield server


@pytest.fixture
def guarded(tmp_path: Path, backend: Backend, auth_server: AuthServer) -> Iterator[Writ]:
    auth = {
        "issuers": [{"issuer": auth_server.issuer}],
        "required_scopes": [SCOPE],
        "jwks_min_refetch_s": 0,
    }
    with writ(tmp_path, backend, f"sqlite:///{tmp_path / 'writ.db'}", auth=auth) as gateway:
        yield gateway


def call_refund(gateway: Writ, token: str | None) -> httpx2.Response:
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


async def refund(gateway: Writ, token: str, key: str) -> str:
    """A refund through the official MCP client; the call's status."""
    async with gateway.client(token) as client:
        result = await client.call_tool("refund_order", REFUND, meta={"writ/idempotencyKey": key})
    return result.meta["writ/status"]


def b64(data: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


def assert_refused(gateway: Writ, response: httpx2.Response) -> None:
    assert response.status_code == 401, response.text
    challenge = response.headers["www-authenticate"]
    assert challenge.startswith("Bearer ")
    assert f'resource_metadata="{gateway.url}/.well-known/oauth-protected-resource/mcp"' in challenge


def test_every_kind_of_bad_token_is_refused_with_401_and_nothing_is_dispatched(
    guarded: Writ, backend: Backend, auth_server: AuthServer
) -> None:
    aud, now = guarded.mcp_url, int(time.time())
    good = auth_server.token("agent-es", scope=SCOPE, resource=aud)
    header, payload, signature = good.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    jwks = httpx2.get(f"{auth_server.issuer}/jwks.json", timeout=5).json()["keys"]
    foreign = ECKey.generate_key("P-256", auto_kid=True)
    mint = auth_server.mint
    # Each refusal says which kind of failure it was, and nothing of the gateway's keys or URLs.
    bad = {
        "none": (None, "Authentication required"),
        "garbage": ("garbage.garbage.garbage", "the token is malformed"),
        "alg none": (f"{b64({'alg': 'none', 'typ': 'JWT'})}.{b64(claims)}.", ALGORITHM),
        "HS256 with the public key": (
            jwt.encode(
                {"alg": "HS256", "kid": jwks[1]["kid"]},
                claims,
                OctKey.import_key(json.dumps(jwks[1]).encode()),
            ),
            ALGORITHM,
        ),
        "foreign key": (jwt.encode({"alg": "ES256", "kid": jwks[1]["kid"]}, claims, foreign), SIGNATURE),
        "unknown kid": (
            jwt.encode({"alg": "ES256", "kid": foreign.kid}, claims, foreign),
            "the token's signing key (kid) is not one its issuer publishes",
        ),
        "tampered payload": (
            f"{header}.{b64(claims | {'roles': ['admin'], 'tenant': 'globex'})}.{signature}",
            SIGNATURE,
        ),
        "expired": (
            mint(aud=aud, scope=SCOPE, sub="a", iat=now - 7200, nbf=now - 7200, exp=now - 3600),
            "the token has expired",
        ),
        "not yet valid": (
            mint(aud=aud, scope=SCOPE, sub="a", nbf=now + 3600, exp=now + 7200),
            "the token is not valid yet",
        ),
        "wrong issuer": (
            mint(aud=aud, scope=SCOPE, sub="a", iss="https://evil.example"),
            "the token's issuer is not trusted here",
        ),
        "wrong audience": (
            auth_server.token("agent-es", scope=SCOPE, resource="https://other.example/mcp"),
            "the token is for another resource (aud)",
        ),
    }
    for name, (token, reason) in bad.items():
        response = call_refund(guarded, token)
        assert response.status_code == 401, f"{name}: {response.status_code} {response.text}"
        assert_refused(guarded, response)
        assert response.json() == {"error": "invalid_token", "error_description": reason}, name
        assert f'error_description="{reason}"' in response.headers["www-authenticate"], name
        for secret in (auth_server.issuer, "jwks", "127.0.0.1", foreign.kid):
            assert secret not in response.json()["error_description"], (name, secret)
    assert backend.refunds() == []
    # What `writ audit export` prints: no call, only the refusals as security events, by kind (the
    # request with no token at all is how a client discovers where to sign in, not an attack).
    security = guarded.runtime.security
    assert isinstance(security, SecurityEvents)
    anyio.run(lambda: security.tick(flush_all=True))
    recorded = guarded.runtime.store.events()
    assert {e.type for e in recorded} == {"security.auth_failed"}
    counted: dict[str, int] = {}
    for event in recorded:
        counted[event.payload["kind"]] = counted.get(event.payload["kind"], 0) + event.payload["count"]
    assert counted == {
        "malformed": 1,
        "algorithm_not_allowed": 2,
        "bad_signature": 2,
        "unknown_key": 1,
        "expired": 1,
        "not_yet_valid": 1,
        "untrusted_issuer": 1,
        "wrong_audience": 1,
    }
    for event in recorded:
        assert all(token is None or token not in str(event) for token, _ in bad.values())
        assert "evil.example" not in str(event)  # an issuer named only when it is trusted here

    # The control: the same gateway does dispatch for a good token of either algorithm.
    for n, client in enumerate(("agent-es", "agent-rs")):
        token = auth_server.token(client, scope=SCOPE, resource=aud)
        assert anyio.run(refund, guarded, token, f"k{n}") == "completed"
    assert len(backend.refunds()) == 2


def test_a_token_a_few_seconds_past_its_exp_is_taken_within_the_leeway_and_refused_with_its_reason_after(
    guarded: Writ, backend: Backend, auth_server: AuthServer
) -> None:
    # The verifier allows 30 s of clock skew; the SDK's bearer backend checks the token's expiry again.
    # It was handed the bare `exp`, so a token in its leeway got a bare 401 "Authentication required",
    # neither taken nor refused with the reason the verifier would give 30 s later.
    aud, now = guarded.mcp_url, int(time.time())
    payload = auth_server.token("agent-es", scope=SCOPE, resource=aud).split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    within = auth_server.mint(**{**claims, "iat": now - 3600, "nbf": now - 3600, "exp": now - 5})
    assert anyio.run(refund, guarded, within, "within-the-leeway") == "completed"
    past = auth_server.mint(**{**claims, "iat": now - 3600, "nbf": now - 3600, "exp": now - 40})
    response = call_refund(guarded, past)
    assert_refused(guarded, response)
    assert response.json() == {"error": "invalid_token", "error_description": "the token has expired"}
    assert len(backend.refunds()) == 1


def test_a_token_without_the_required_scope_gets_403_naming_the_scope(
    guarded: Writ, backend: Backend, auth_server: AuthServer
) -> None:
    response = call_refund(guarded, auth_server.token("agent-es", resource=guarded.mcp_url))
    assert response.status_code == 403
    assert 'error="insufficient_scope"' in response.headers["www-authenticate"]
    assert response.json()["error_description"] == f"Required scope: {SCOPE}"
    assert backend.refunds() == []


def test_protected_resource_metadata_lists_every_trusted_issuer(
    guarded: Writ, auth_server: AuthServer
) -> None:
    for path in ("/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp"):
        metadata = httpx2.get(guarded.url + path, timeout=5).json()
        servers = [s.rstrip("/") for s in metadata["authorization_servers"]]
        # Writ's own authorization server (the demo config runs it) and the configured issuer; never
        # the dev issuer, which has no endpoints to name.
        assert servers == [guarded.url, auth_server.issuer]
        assert metadata["resource"] == guarded.mcp_url and metadata["scopes_supported"] == [SCOPE]


def test_a_key_rotation_at_the_issuer_is_picked_up_without_a_restart(
    guarded: Writ, auth_server: AuthServer
) -> None:
    before = auth_server.token("agent-rs", scope=SCOPE, resource=guarded.mcp_url)
    assert anyio.run(refund, guarded, before, "before") == "completed"
    auth_server.rotate_keys()
    rotated = auth_server.token("agent-rs", scope=SCOPE, resource=guarded.mcp_url)
    assert anyio.run(refund, guarded, rotated, "after") == "completed"


def test_a_jwks_endpoint_that_is_down_refuses_tokens_and_says_so_in_the_log(
    guarded: Writ, backend: Backend, auth_server: AuthServer, caplog: pytest.LogCaptureFixture
) -> None:
    auth_server.set_jwks_status(503)
    with caplog.at_level(logging.ERROR, logger="gateway.auth.issuers"):
        response = call_refund(guarded, auth_server.token("agent-es", scope=SCOPE, resource=guarded.mcp_url))
    assert_refused(guarded, response)
    assert backend.refunds() == []
    logged = [r.getMessage() for r in caplog.records if r.name == "gateway.auth.issuers"]
    assert any(
        f"JWKS at {auth_server.issuer}/jwks.json answered HTTP 503" in m
        and "its tokens are refused until it answers" in m
        for m in logged
    ), logged
