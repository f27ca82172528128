"""Backends behind OAuth 2.0 client credentials, against a real authorization server process (authlib):
one token fetched and reused, shared by concurrent calls, refreshed before it expires, dropped when the
backend refuses it; a token endpoint that fails means the call fails before anything is sent."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from bench.processes import free_port
from capabilities.config import HttpBackend, McpBackend, RequestSpec, parse_config
from capabilities.contract import Capability, ConfigError
from capabilities.credentials import Credentials
from capabilities.http import HttpExecutor, HttpRoute
from capabilities.mcp_upstream import McpExecutor
from capabilities.oauth_tokens import ClientCredentialsTokens
from capabilities.registry import Registry
from tests.capabilities.conftest import invocation
from tests.capabilities.servers import ServerState
from tests.gateway.auth.oauth_process import AuthServer, auth_server
from tests.gateway.auth.oauth_server import CLIENTS

pytestmark = pytest.mark.anyio

OBJECT = {"type": "object"}
RESOURCE = "https://payments.internal"
CLIENT = "writ-backend"
SECRET = CLIENTS[CLIENT]["secret"]


@pytest.fixture(scope="module")
def oauth_server() -> Iterator[AuthServer]:
    with auth_server("http://unused.example/mcp") as server:
        yield server


@pytest.fixture
def oauth(oauth_server: AuthServer) -> Iterator[AuthServer]:
    oauth_server.set_token_endpoint(200)
    yield oauth_server
    oauth_server.set_token_endpoint(200)


def client_credentials(token_url: str, client_id: str = CLIENT, **extra: Any) -> dict[str, Any]:
    return {
        "type": "oauth2_client_credentials",
        "token_url": token_url,
        "client_id": client_id,
        "client_secret_env": "BACKEND_CLIENT_SECRET",
        "resource": RESOURCE,
        **extra,
    }


def http_registry(url: str, auth: dict[str, Any], secret: str = SECRET) -> Registry:
    capabilities = [
        {
            "id": "refund-order",
            "backend": "acme",
            "input_schema": OBJECT,
            "request": {"method": "POST", "path": "/refunds"},
            "reconcile": {"method": "GET", "path": "/refunds?idempotency_key={idempotency_key}"},
        },
        {
            "id": "get-order",
            "backend": "acme",
            "effect": "read",
            "input_schema": OBJECT,
            "request": {"method": "GET", "path": "/orders/{order_id}"},
        },
    ]
    backend = {"type": "http", "base_url": url, "timeout_s": 5, "auth": auth}
    return Registry.from_config(
        parse_config({"acme": backend}, capabilities), environ={"BACKEND_CLIENT_SECRET": secret}
    )


async def call(registry: Registry, tool: str, arguments: dict[str, Any] | None = None) -> Any:
    cap = registry.get(tool)
    assert cap is not None
    return await registry.executor(cap).execute(invocation(cap, arguments))


def claims(authorization: str) -> dict[str, Any]:
    scheme, token = authorization.split(" ", 1)
    assert scheme == "Bearer"
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


async def test_an_http_backend_gets_a_client_credentials_token_once_and_reuses_it(
    oauth: AuthServer, backend_url: str, backend_state: ServerState
) -> None:
    before = oauth.token_requests(CLIENT)
    async with http_registry(backend_url, client_credentials(f"{oauth.issuer}/token")) as registry:
        outcomes = [await call(registry, "get-order", {"order_id": str(n)}) for n in range(3)]

    assert [o.kind for o in outcomes] == ["completed"] * 3
    assert oauth.token_requests(CLIENT) == before + 1
    sent = {headers["authorization"] for headers in backend_state.headers}
    assert len(sent) == 1
    token = claims(sent.pop())
    assert (token["client_id"], token["aud"]) == (CLIENT, RESOURCE)


async def test_the_client_secret_can_be_sent_in_the_form_body_and_read_from_a_file(
    oauth: AuthServer, backend_url: str, backend_state: ServerState, tmp_path: Any
) -> None:
    (tmp_path / "client.secret").write_text(SECRET + "\n")
    auth = client_credentials(f"{oauth.issuer}/token", auth_method="client_secret_post", scope="refunds")
    del auth["client_secret_env"]
    auth["client_secret_file"] = str(tmp_path / "client.secret")
    async with http_registry(backend_url, auth) as registry:
        outcome = await call(registry, "get-order", {"order_id": "7"})

    assert outcome.kind == "completed", outcome.detail
    assert claims(backend_state.headers[0]["authorization"])["scope"] == "refunds"


async def test_concurrent_calls_share_one_token_fetch(
    oauth: AuthServer, backend_url: str, backend_state: ServerState
) -> None:
    oauth.set_token_endpoint(200, delay_s=0.3)
    before = oauth.token_requests(CLIENT)
    async with http_registry(backend_url, client_credentials(f"{oauth.issuer}/token")) as registry:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                for n in range(10):
                    tg.start_soon(call, registry, "get-order", {"order_id": str(n)})

    assert oauth.token_requests(CLIENT) == before + 1
    assert backend_state.hits["orders"] == 10
    assert len({headers["authorization"] for headers in backend_state.headers}) == 1


async def test_a_token_is_fetched_again_before_it_expires(
    oauth: AuthServer, backend_url: str, backend_state: ServerState
) -> None:
    now = [1000.0]
    client = "writ-backend-short"  # 4-second tokens: refreshed 2 s before expiry (half the lifetime)
    tokens = ClientCredentialsTokens(
        "backend 'acme'",
        token_url=f"{oauth.issuer}/token",
        client_id=client,
        client_secret=CLIENTS[client]["secret"],
        clock=lambda: now[0],
    )
    cap = Capability(id="get-order", version="1", tool_name="get_order", backend="acme", input_schema=OBJECT)
    executor = HttpExecutor(
        "acme",
        HttpBackend(type="http", base_url=backend_url),
        {"get-order": HttpRoute(RequestSpec(method="GET", path="/orders/{order_id}"))},
        Credentials(headers={}, tokens=tokens),
    )
    before = oauth.token_requests(client)
    await executor.start()
    try:
        await executor.execute(invocation(cap, {"order_id": "1"}))
        now[0] += 1.9
        await executor.execute(invocation(cap, {"order_id": "2"}))
        assert oauth.token_requests(client) == before + 1
        now[0] += 0.2  # 2.1 s after the fetch: inside the refresh margin, still valid at the issuer
        await executor.execute(invocation(cap, {"order_id": "3"}))
    finally:
        await executor.close()

    assert oauth.token_requests(client) == before + 2
    first, second, third = (headers["authorization"] for headers in backend_state.headers)
    assert first == second != third


async def test_a_backend_that_refuses_the_token_makes_the_next_call_fetch_a_new_one(
    oauth: AuthServer, backend_url: str, backend_state: ServerState
) -> None:
    before = oauth.token_requests(CLIENT)
    async with http_registry(backend_url, client_credentials(f"{oauth.issuer}/token")) as registry:
        # The test backend's /refunds wants another token and answers 401: failed, never retried.
        refused = await call(registry, "refund-order", {"amount": 1})
        await call(registry, "get-order", {"order_id": "1"})

    assert (refused.kind, refused.error) == ("failed", "http_401")
    assert backend_state.hits["refunds"] == 1
    assert oauth.token_requests(CLIENT) == before + 2


@pytest.mark.parametrize("failure", ["http_503", "wrong_secret", "unreachable", "too_slow"])
async def test_a_failing_token_endpoint_fails_the_call_as_unreachable_before_anything_is_sent(
    failure: str, oauth: AuthServer, backend_url: str, backend_state: ServerState
) -> None:
    token_url, secret, extra = f"{oauth.issuer}/token", SECRET, {}
    if failure == "http_503":
        oauth.set_token_endpoint(503)
    elif failure == "wrong_secret":
        secret = "not-the-secret"
    elif failure == "unreachable":
        token_url = f"http://127.0.0.1:{free_port()}/token"
    else:
        oauth.set_token_endpoint(200, delay_s=3)
        extra = {"timeout_s": 0.5}
    auth = client_credentials(token_url, **extra)
    async with http_registry(backend_url, auth, secret=secret) as registry:
        with anyio.fail_after(10):
            write = await call(registry, "refund-order", {"amount": 5})
            cap = registry.get("refund-order")
            assert cap is not None
            lookup = await registry.executor(cap).reconcile(invocation(cap))

    assert (write.kind, write.error) == ("failed", "backend_unreachable")
    assert "token endpoint" in write.detail
    assert secret not in write.detail and SECRET not in write.detail
    assert lookup.verdict == "inconclusive"
    assert backend_state.hits["refunds"] == backend_state.hits["find_refunds"] == 0


async def test_a_missing_client_secret_is_a_config_error_naming_the_variable(oauth: AuthServer) -> None:
    with pytest.raises(ConfigError, match="BACKEND_CLIENT_SECRET"):
        Registry.from_config(
            parse_config(
                {
                    "acme": {
                        "type": "http",
                        "base_url": "http://x.invalid",
                        "auth": client_credentials(oauth.issuer),
                    }
                },
                [],
            ),
            environ={},
        )


def test_client_credentials_config_needs_exactly_one_secret_source_and_a_plain_token_url() -> None:
    both = client_credentials("https://login.example/token", client_secret_file="/run/secret")
    userinfo = client_credentials("https://user:pw@login.example/token")
    for auth in (both, userinfo):
        with pytest.raises(ConfigError, match="backend 'acme': auth"):
            Registry.from_config(
                parse_config({"acme": {"type": "http", "base_url": "http://x.invalid", "auth": auth}}, [])
            )


# --- upstream MCP over streamable HTTP ---------------------------------------------------------------


def mcp_registry(url: str, auth: dict[str, Any]) -> Registry:
    backend = {"type": "mcp", "url": url, "auth": auth, "timeout_s": 5, "tools": ["write_file"]}
    return Registry.from_config(
        parse_config({"files": backend}, []), environ={"BACKEND_CLIENT_SECRET": SECRET}
    )


async def test_an_mcp_upstream_gets_the_token_on_every_request_and_fetches_it_once(
    oauth: AuthServer, upstream_url: str, upstream_state: ServerState
) -> None:
    before = oauth.token_requests(CLIENT)
    async with mcp_registry(upstream_url, client_credentials(f"{oauth.issuer}/token")) as registry:
        outcomes = [await call(registry, "write_file", {"path": f"/tmp/{n}"}) for n in range(2)]

    assert [o.kind for o in outcomes] == ["completed", "completed"]
    assert oauth.token_requests(CLIENT) == before + 1
    sent = {headers["authorization"] for headers in upstream_state.headers}
    assert len(sent) == 1
    assert claims(sent.pop())["client_id"] == CLIENT


async def test_an_mcp_call_whose_token_cannot_be_renewed_is_unreachable_and_not_sent(
    oauth: AuthServer, upstream_url: str, upstream_state: ServerState
) -> None:
    now = [1000.0]
    tokens = ClientCredentialsTokens(
        "backend 'files'",
        token_url=f"{oauth.issuer}/token",
        client_id=CLIENT,
        client_secret=SECRET,
        clock=lambda: now[0],
    )
    config = McpBackend(type="mcp", url=upstream_url, timeout_s=5, tools=["write_file"])
    executor = McpExecutor("files", config, Credentials(headers={}, tokens=tokens))
    await executor.start()
    try:
        (cap,) = await executor.discover()
        oauth.set_token_endpoint(503)
        now[0] += 600  # the token is due for renewal, and the token endpoint is down
        with anyio.fail_after(10):
            outcome = await executor.execute(invocation(cap, {"path": "/tmp/x"}))
    finally:
        await executor.close()

    assert (outcome.kind, outcome.error) == ("failed", "backend_unreachable")
    assert upstream_state.hits["write_file"] == 0
