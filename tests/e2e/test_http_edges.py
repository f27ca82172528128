"""What a client that speaks badly gets: malformed JSON-RPC, missing or bad tokens, unknown routes."""

from __future__ import annotations

import time

import httpx2
import pytest

from tests.e2e.harness import Backend, Gateway

pytestmark = pytest.mark.e2e

MCP_HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


def post(gateway: Gateway, body: bytes, token: str | None) -> httpx2.Response:
    headers = dict(MCP_HEADERS)
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return httpx2.post(gateway.mcp_url, content=body, headers=headers, timeout=10)


def test_a_request_without_a_token_gets_401_with_the_resource_metadata_url(sqlite_gateway: Gateway) -> None:
    response = post(sqlite_gateway, b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}', None)
    assert response.status_code == 401
    challenge = response.headers["www-authenticate"]
    assert challenge.startswith("Bearer ")
    assert f'resource_metadata="{sqlite_gateway.url}/.well-known/oauth-protected-resource/mcp"' in challenge


@pytest.mark.parametrize(
    "token",
    ["garbage", "a.b.c", "eyJhbGciOiJub25lIn0.eyJzdWIiOiJhbGljZSJ9."],
    ids=["garbage", "three-dots", "alg-none"],
)
def test_a_bad_token_gets_401_and_reaches_nothing(
    sqlite_gateway: Gateway, backend: Backend, token: str
) -> None:
    body = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"refund_order","arguments":{}}}'
    response = post(sqlite_gateway, body, token)
    assert response.status_code == 401
    assert response.json()["error"] == "invalid_token"
    assert backend.refunds() == []


def test_a_token_for_another_resource_is_refused(sqlite_gateway: Gateway, tmp_path) -> None:
    from gateway.dev_issuer import DevIssuer

    issuer = DevIssuer.load_or_create(tmp_path / "dev-issuer.jwk", f"{sqlite_gateway.url}/dev-issuer")
    foreign = issuer.mint(subject="alice", audience="https://elsewhere.example/mcp", roles=["agent"])
    assert post(sqlite_gateway, b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}', foreign).status_code == 401


def test_an_expired_token_is_refused(sqlite_gateway: Gateway, tmp_path) -> None:
    from gateway.dev_issuer import DevIssuer

    issuer = DevIssuer.load_or_create(tmp_path / "dev-issuer.jwk", f"{sqlite_gateway.url}/dev-issuer")
    expired = issuer.mint(subject="alice", audience=sqlite_gateway.mcp_url, ttl_s=60, now=time.time() - 3600)
    assert post(sqlite_gateway, b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}', expired).status_code == 401


@pytest.mark.parametrize(
    ("body", "code"),
    [(b"{", -32700), (b"[1,2", -32700), (b'{"jsonrpc":"2.0","id":1}', -32602), (b'"just a string"', -32602)],
    ids=["truncated-object", "truncated-array", "no-method", "not-an-object"],
)
def test_malformed_json_rpc_gets_a_json_rpc_error(sqlite_gateway: Gateway, body: bytes, code: int) -> None:
    response = post(sqlite_gateway, body, sqlite_gateway.token("alice"))
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == code
    assert error["message"]


def test_protected_resource_metadata_names_the_resource_and_its_issuer(sqlite_gateway: Gateway) -> None:
    for path in ("/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource"):
        metadata = httpx2.get(sqlite_gateway.url + path, timeout=5).json()
        assert metadata["resource"] == sqlite_gateway.mcp_url
        assert metadata["authorization_servers"] == [f"{sqlite_gateway.url}/dev-issuer"]


def test_health_and_readiness_answer(sqlite_gateway: Gateway) -> None:
    assert httpx2.get(f"{sqlite_gateway.url}/healthz", timeout=5).json() == {"ok": True}
    assert httpx2.get(f"{sqlite_gateway.url}/readyz", timeout=5).json() == {"ready": True}


def test_the_calls_api_needs_a_token_and_hides_other_tenants(sqlite_gateway: Gateway) -> None:
    import anyio

    async def make_call() -> str:
        async with sqlite_gateway.client(sqlite_gateway.token("alice")) as client:
            result = await client.call_tool("lookup_order", {"order_id": "1001"})
            return result.meta["writ/toolCallId"]

    tool_call_id = anyio.run(make_call)
    url = f"{sqlite_gateway.url}/api/calls/{tool_call_id}"
    assert httpx2.get(url, timeout=5).status_code == 401
    own = httpx2.get(url, headers={"Authorization": f"Bearer {sqlite_gateway.token('alice')}"}, timeout=5)
    assert own.status_code == 200 and own.json()["status"] == "completed"
    other = httpx2.get(
        url, headers={"Authorization": f"Bearer {sqlite_gateway.token('eve', tenant='x')}"}, timeout=5
    )
    assert other.status_code == 404


def post_2026(gateway: Gateway, name_header: str, method_header: str) -> tuple[int, dict]:
    """A 2026-07-28 tools/call over http.client, which sends header values byte for byte."""
    import http.client
    import json
    from urllib.parse import urlsplit

    envelope = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "lookup_order", "arguments": {"order_id": "1001"}, "_meta": envelope},
    }
    url = urlsplit(gateway.mcp_url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    try:
        connection.request(
            "POST",
            url.path,
            body=json.dumps(body),
            headers={
                **MCP_HEADERS,
                "Authorization": f"Bearer {gateway.token('alice')}",
                "MCP-Protocol-Version": "2026-07-28 ",
                "Mcp-Method": method_header,
                "Mcp-Name": name_header,
            },
        )
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def test_whitespace_around_a_header_value_is_not_part_of_it(sqlite_gateway: Gateway) -> None:
    # RFC 9110 §5.5; the conformance suite's http-header-validation (SEP-2243). uvicorn's parser kept
    # trailing whitespace, so this request was refused with 400 / -32020 (header mismatch).
    status, answer = post_2026(sqlite_gateway, "  lookup_order \t", "tools/call  ")
    assert status == 200, answer
    assert answer["result"]["_meta"]["writ/status"] == "completed"
    status, answer = post_2026(sqlite_gateway, " refund_order ", "tools/call")
    assert (status, answer["error"]["code"]) == (400, -32020)
