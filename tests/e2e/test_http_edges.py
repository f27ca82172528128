"""What a client that speaks badly gets: malformed JSON-RPC, missing or bad tokens, unknown routes.

Against the whole gateway served in this process (`inproc_sqlite_gateway`, `inproc_gateway`: the
composition root and `writ serve`'s uvicorn settings, its HTTP parser included; the CLI run by its own
`main`): what is checked is what the gateway answers, not how a process starts or dies.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx2
import pytest

from tests.e2e.harness import Backend, Gateway
from tests.gateway.mcp import inproc

MCP_HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


# The cases share one gateway per module (conftest): SQLite for those about the edge, one per store
# for those about what the store can hold. None of them needs a gateway of its own but the last.
@pytest.fixture
def sqlite_gateway(inproc_sqlite_gateway: Gateway) -> Gateway:
    return inproc_sqlite_gateway


@pytest.fixture
def gateway(inproc_gateway: Gateway) -> Gateway:
    return inproc_gateway


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
    sqlite_gateway: Gateway, inproc_sqlite_backend: Backend, token: str
) -> None:
    before = inproc_sqlite_backend.refunds()
    body = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"refund_order","arguments":{}}}'
    response = post(sqlite_gateway, body, token)
    assert response.status_code == 401
    assert response.json()["error"] == "invalid_token"
    assert inproc_sqlite_backend.refunds() == before


def test_a_token_for_another_resource_is_refused(sqlite_gateway: Gateway, tmp_path) -> None:
    from gateway.auth.dev_issuer import DevIssuer

    issuer = DevIssuer.load_or_create(tmp_path / "dev-issuer.jwk", f"{sqlite_gateway.url}/dev-issuer")
    foreign = issuer.mint(subject="alice", audience="https://elsewhere.example/mcp", roles=["agent"])
    assert post(sqlite_gateway, b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}', foreign).status_code == 401


def test_an_expired_token_is_refused(sqlite_gateway: Gateway, tmp_path) -> None:
    from gateway.auth.dev_issuer import DevIssuer

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


def test_protected_resource_metadata_names_the_resource_and_writs_authorization_server(
    sqlite_gateway: Gateway,
) -> None:
    for path in ("/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource"):
        metadata = httpx2.get(sqlite_gateway.url + path, timeout=5).json()
        assert metadata["resource"] == sqlite_gateway.mcp_url
        assert metadata["authorization_servers"] == [f"{sqlite_gateway.url}/"]


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


ENVELOPE_2026 = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
}


def call_2026(gateway: Gateway, token: str, tool: str, arguments: str, meta: str = "{}") -> tuple[int, dict]:
    """A 2026-07-28 tools/call whose `arguments` and `_meta` are sent as the raw JSON text given."""
    import json

    envelope = json.dumps({**ENVELOPE_2026, **json.loads(meta)})
    body = (
        f'{{"jsonrpc":"2.0","id":7,"method":"tools/call",'
        f'"params":{{"name":{json.dumps(tool)},"arguments":{arguments},"_meta":{envelope}}}}}'
    )
    response = httpx2.post(
        gateway.mcp_url,
        content=body.encode(),
        headers={
            **MCP_HEADERS,
            "Authorization": f"Bearer {token}",
            "MCP-Protocol-Version": "2026-07-28",
            "Mcp-Method": "tools/call",
            "Mcp-Name": tool,
        },
        timeout=30,
    )
    return response.status_code, response.json()


NOT_JSON = [
    ("NaN", '"r"', "amount: NaN is not a JSON number"),
    ("Infinity", '"r"', "amount: Infinity is not a JSON number"),
    ("-Infinity", '"r"', "amount: -Infinity is not a JSON number"),
    ("1e400", '"r"', "amount: Infinity is not a JSON number"),
    ("20", '"\\ud800"', "reason: the string holds a lone surrogate"),
    ("20", "[" * 200 + "]" * 200, "nested deeper than 64 levels"),
]


def test_arguments_that_are_not_json_are_refused_recorded_and_never_sent(
    gateway: Gateway, inproc_backend: Backend
) -> None:
    # Python's json (the 2026-07-28 transport's parser) reads NaN, Infinity, 1e400 (as infinity) and lone
    # surrogate escapes; canonical JSON, UTF-8 encoding and the store's serializer (at ~250 levels) then
    # raised, and the client got -32603 "Internal server error" (or, on a 2025-11-25 session, code 0 with
    # the exception's text) with nothing recorded.
    token, before = gateway.token("alice"), inproc_backend.refunds()
    for amount, reason, error in NOT_JSON:
        arguments = f'{{"order_id":"1001","amount":{amount},"currency":"EUR","reason":{reason}}}'
        status, answer = call_2026(gateway, token, "refund_order", arguments)
        assert status == 200, (amount, answer)
        result = answer["result"]
        assert result["isError"] is True
        assert result["structuredContent"]["reason"] == "invalid_arguments"
        assert any(error in e for e in result["structuredContent"]["errors"]), result
        shown = gateway.cli("calls", "show", result["_meta"]["writ/toolCallId"]).stdout
        assert "tool_call.denied" in shown and "invalid_arguments" in shown
    assert inproc_backend.refunds() == before
    assert "hash chain intact" in gateway.cli("audit", "verify").stdout
    # The server goes on serving.
    status, answer = call_2026(gateway, token, "lookup_order", '{"order_id":"1001"}')
    assert answer["result"]["_meta"]["writ/status"] == "completed"


BAD_IDS = ["k\\u0000", "\\ud800", "caf\\u00e9", " padded ", "x" * 256, "", "\\n"]


def test_a_key_or_run_id_that_cannot_be_stored_or_sent_is_refused_before_anything_runs(
    gateway: Gateway, inproc_backend: Backend
) -> None:
    # A NUL in either was a -32603 on PostgreSQL (text cannot hold NUL), a lone surrogate one on both
    # stores, and a key with a control character was recorded, dispatched and failed in the executor
    # (an HTTP header cannot carry it).
    token = gateway.token("alice")
    refunds, calls = inproc_backend.refunds(), gateway.recorded_calls()
    arguments = '{"order_id":"1001","amount":20,"currency":"EUR","reason":"r"}'
    for name in ("writ/idempotencyKey", "writ/runId"):
        for value in BAD_IDS:
            status, answer = call_2026(gateway, token, "refund_order", arguments, f'{{"{name}":"{value}"}}')
            assert status == 400, (name, value, answer)
            assert answer["error"]["code"] == -32602 and name in answer["error"]["message"]
    assert inproc_backend.refunds() == refunds
    assert gateway.recorded_calls() == calls  # nothing recorded


def test_writ_call_status_with_an_odd_tool_call_id_says_not_found(gateway: Gateway) -> None:
    # NUL was a -32603 on PostgreSQL, a lone surrogate on both; a huge id was echoed back whole.
    token = gateway.token("alice")
    for tool_call_id in ["tc_\\u0000", "tc_\\ud800", "t" * 100_000, "x' OR '1'='1", "tc_\\u00e9"]:
        status, answer = call_2026(gateway, token, "writ_call_status", f'{{"toolCallId":"{tool_call_id}"}}')
        assert status == 200, (tool_call_id[:20], answer)
        result = answer["result"]
        assert result["isError"] is True and result["structuredContent"]["status"] == "not_found"
        assert len(str(result)) < 2000
    # Another tenant's call is not found either.
    status, answer = call_2026(gateway, token, "lookup_order", '{"order_id":"1001"}')
    tool_call_id = answer["result"]["_meta"]["writ/toolCallId"]
    eve = gateway.token("eve", tenant="other")
    status, answer = call_2026(gateway, eve, "writ_call_status", f'{{"toolCallId":"{tool_call_id}"}}')
    assert answer["result"]["structuredContent"]["status"] == "not_found"
    assert "Ada" not in str(answer)


def test_api_ids_and_texts_with_nul_get_clear_answers_on_both_stores(
    gateway: Gateway, inproc_backend: Backend
) -> None:
    # PostgreSQL's text cannot hold NUL: each of these was a 500 there (a DataError), where SQLite
    # answered; a decision's reason with NUL could not be recorded.
    before = inproc_backend.refunds()
    arguments = '{"order_id":"1001","amount":250,"currency":"EUR","reason":"r"}'
    status, answer = call_2026(gateway, gateway.token("alice"), "refund_order", arguments)
    approval_id = answer["result"]["structuredContent"]["approvalId"]
    carol = {"Authorization": f"Bearer {gateway.token('carol', roles='approver,admin')}"}
    for path in ("/api/calls/tc_%00", "/api/runs/r%00/events", "/api/approvals/ap_%00"):
        assert httpx2.get(gateway.url + path, headers=carol, timeout=10).status_code == 404, path
    listed = httpx2.get(f"{gateway.url}/api/approvals?status=%00", headers=carol, timeout=10)
    assert listed.status_code == 200 and listed.json() == {"approvals": []}
    decision = httpx2.post(
        f"{gateway.url}/api/approvals/{approval_id}/decision",
        json={"decision": "approve", "reason": "ok\u0000"},
        headers=carol,
        timeout=10,
    )
    assert decision.status_code == 400 and decision.json()["error"] == "invalid_request"
    pending = httpx2.get(f"{gateway.url}/api/approvals/{approval_id}", headers=carol, timeout=10).json()
    assert pending["status"] == "awaiting_approval"
    revoked = httpx2.post(
        f"{gateway.url}/api/principals/bob%00/revocation", json={}, headers=carol, timeout=10
    )
    assert revoked.status_code == 400
    assert inproc_backend.refunds() == before
    assert "hash chain intact" in gateway.cli("audit", "verify").stdout


def test_an_api_body_over_the_limit_is_refused_with_413_without_being_read(sqlite_gateway: Gateway) -> None:
    # Any agent's token could POST a 300 MB "decision": read whole, then parsed, it took the gateway
    # to about 1 GB before the reason's length check refused it.
    headers = {"Authorization": f"Bearer {sqlite_gateway.token('alice')}", "Content-Type": "application/json"}
    url = f"{sqlite_gateway.url}/api/approvals/ap_x/decision"
    huge = b'{"decision": "approve", "reason": "' + b"x" * (2 * 1024 * 1024) + b'"}'

    def chunked():  # no Content-Length: counted as it arrives
        yield huge[: 1024 * 1024]
        yield huge[1024 * 1024 :]

    for content in (huge, chunked()):
        response = httpx2.post(url, content=content, headers=headers, timeout=30)
        assert response.status_code == 413, response.text
        assert response.json()["error"] == "request_too_large"
    # An ordinary body still reaches the handler.
    response = httpx2.post(url, json={"decision": "approve"}, headers=headers, timeout=10)
    assert response.status_code == 404, response.text


def test_with_allowed_hosts_a_browser_client_from_the_public_origin_is_served_and_others_get_403(
    tmp_path: Path, inproc_sqlite_backend: Backend
) -> None:
    server = {"public_url": "http://writ.example", "allowed_hosts": ["127.0.0.1:*"]}
    # Writ's authorization server would refuse to start on plain http off loopback (OAuth needs TLS).
    auth = {"authorization_server": {"enabled": False}}
    store_url = f"sqlite:///{tmp_path / 'writ.db'}"
    with inproc.writ(tmp_path, inproc_sqlite_backend, store_url, server=server, auth=auth) as gateway:
        token = gateway.token("alice")
        body = json.dumps(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {},
                    "clientInfo": {"name": "browser", "version": "1"},
                },
            }
        )

        def from_origin(origin: str | None) -> httpx2.Response:
            headers = {"Authorization": f"Bearer {token}", **MCP_HEADERS} | (
                {"Origin": origin} if origin else {}
            )
            return httpx2.post(gateway.mcp_url, content=body, headers=headers, timeout=10)

        assert from_origin(None).status_code == 200
        assert from_origin("http://writ.example").status_code == 200
        assert from_origin("http://evil.example").status_code == 403
