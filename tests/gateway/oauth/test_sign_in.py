"""Signing in end to end with clients nobody here wrote: the official MCP SDK's OAuth client discovers
Writ's authorization server from the 401, registers, sends the browser (Debian's Chromium through
Playwright) through the real login and consent pages, takes the code from its loopback redirect,
calls tools with the token and refreshes it. The gateway runs in-process (`inproc.py`)."""

from __future__ import annotations

import contextlib
import queue
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import anyio.to_thread
import httpx2
import pytest
import uvicorn
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import (
    AuthorizationCodeResult,
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthToken,
)
from playwright.async_api import Browser, Page, expect
from pydantic import AnyUrl
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Route

from tests.e2e.harness import free_port
from tests.gateway.mcp.inproc import Writ, acme, serving, writ

pytestmark = pytest.mark.anyio

WAIT_S = 30


@dataclass
class Callback:
    """The client's loopback redirect target: a real listener, as a native MCP client opens one."""

    uri: str
    received: queue.Queue[dict[str, str]] = field(default_factory=queue.Queue)

    async def next(self) -> dict[str, str]:
        return await anyio.to_thread.run_sync(lambda: self.received.get(timeout=WAIT_S))


@dataclass
class Storage:
    """The SDK's TokenStorage, in memory."""

    tokens: OAuthToken | None = None
    client: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Writ]:
    with acme(tmp_path_factory.mktemp("acme")) as backend:
        workdir = tmp_path_factory.mktemp("writ")
        with writ(workdir, backend, f"sqlite:///{workdir / 'writ.db'}") as g:
            yield g


@pytest.fixture(scope="module")
def callback() -> Iterator[Callback]:
    port = free_port()
    target = Callback(f"http://127.0.0.1:{port}/callback")

    async def arrived(request: Request) -> HTMLResponse:
        target.received.put(dict(request.query_params))
        return HTMLResponse("<p id=done>Signed in. You can close this window.</p>")

    app = Starlette(routes=[Route("/callback", arrived)])
    with serving(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")):
        yield target


def provider(
    gateway: Writ, callback: Callback, page: Page, storage: Storage, user: str
) -> OAuthClientProvider:
    """The SDK's OAuth client whose redirect goes to `page`, where `user` signs in and allows."""

    async def open_in_browser(url: str) -> None:
        await page.goto(url)
        await expect(page.locator("#client-name")).to_have_text("Writ sign-in test")
        await page.click(f"#user-{user}")
        await expect(page.locator("#acting-as")).to_contain_text(f"{user} · tenant acme")
        await expect(page.locator("#redirect-uri")).to_have_text(callback.uri)
        await page.click("#allow")
        await expect(page.locator("#done")).to_be_visible()

    async def code_from_redirect() -> AuthorizationCodeResult:
        params = await callback.next()
        return AuthorizationCodeResult(code=params["code"], state=params.get("state"), iss=params.get("iss"))

    metadata = OAuthClientMetadata(
        redirect_uris=[AnyUrl(callback.uri)],
        client_name="Writ sign-in test",
        grant_types=["authorization_code", "refresh_token"],
        response_types=["code"],
        token_endpoint_auth_method="none",
    )
    return OAuthClientProvider(gateway.mcp_url, metadata, storage, open_in_browser, code_from_redirect)


@contextlib.asynccontextmanager
async def signed_in_client(auth: OAuthClientProvider, url: str) -> AsyncIterator[Client]:
    async with (
        httpx2.AsyncClient(auth=auth, timeout=WAIT_S) as http,
        Client(streamable_http_client(url, http_client=http)) as client,
    ):
        yield client


async def test_the_sdk_client_signs_in_through_the_browser_calls_tools_and_refreshes(
    gateway: Writ, callback: Callback, browser: Browser
) -> None:
    page = await (await browser.new_context()).new_page()
    page.set_default_timeout(WAIT_S * 1000)
    storage = Storage()
    auth = provider(gateway, callback, page, storage, "demo-agent")
    async with signed_in_client(auth, gateway.mcp_url) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        looked_up = await client.call_tool("lookup_order", {"order_id": "1001"})
        assert storage.tokens is not None and storage.client is not None
        first = storage.tokens
        # The access token runs out (forced, rather than waited for): the client refreshes it.
        auth.context.token_expiry_time = time.time() - 1
        again = await client.call_tool("lookup_order", {"order_id": "1002"})
    assert {"lookup_order", "refund_order"} <= names
    assert looked_up.is_error is False and again.is_error is False
    assert storage.tokens.access_token != first.access_token
    assert storage.tokens.refresh_token not in (None, first.refresh_token)
    store = gateway.runtime.store
    assert first.refresh_token is not None
    used = store.find_refresh_token(first.refresh_token)
    assert used is not None and used.used_at is not None, "the refresh went through Writ's /token"
    for result in (looked_up, again):
        call = store.get_call(result.meta["writ/toolCallId"])
        assert call is not None and (call.tenant, call.subject) == ("acme", "demo-agent")
        assert call.principal is not None and call.principal.client_id == storage.client.client_id, (
            call.principal
        )
