"""The running `writ serve` in front of a real OAuth server: a JWKS that is down refuses tokens and the
process's log says why. What each kind of bad token gets is in gateway/auth/test_bad_tokens.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

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


def assert_refused(gateway: Gateway, response: httpx2.Response) -> None:
    assert response.status_code == 401, response.text
    challenge = response.headers["www-authenticate"]
    assert challenge.startswith("Bearer ")
    assert f'resource_metadata="{gateway.url}/.well-known/oauth-protected-resource/mcp"' in challenge


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
