"""Clients known by their metadata document, and an admin's control of what any client was issued, end to
end: the official MCP SDK's OAuth client signs in with a client metadata URL (its document on a real
HTTPS server, the browser steps in Chromium), calls tools and refreshes; an admin then lists the client,
sees the sign-in and revokes it (API, CLI, console), and the client's access token is refused at once and
its refresh token no longer works, through the SDK too. Each revocation is an event in the log."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote

import httpx2
import pytest
from mcp.client.auth import OAuthClientProvider
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientMetadata
from playwright.async_api import Browser, Page, expect
from pydantic import AnyUrl
from typer.testing import CliRunner

from gateway.cli.main import app
from tests.gateway.mcp.inproc import Writ, acme, writ
from tests.gateway.oauth.documents_host import DocumentsHost, documents_host
from tests.gateway.oauth.flow import Pkce, exchange, redirected, refresh, register, sign_in, tools_list
from tests.gateway.oauth.flow import authorization_params as params_for
from tests.gateway.oauth.test_documents import authorization_server
from tests.gateway.oauth.test_sign_in import WAIT_S, Callback, Storage, signed_in_client
from tests.gateway.oauth.test_sign_in import callback as callback  # noqa: F401 (a fixture)

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DocumentsHost]:
    with documents_host(tmp_path_factory.mktemp("docs")) as published:
        yield published


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, host: DocumentsHost) -> Iterator[Writ]:
    with acme(tmp_path_factory.mktemp("acme")) as backend:
        workdir = tmp_path_factory.mktemp("writ")
        auth = authorization_server(workdir, allow_private_addresses=True, ca_file=str(host.ca_file))
        with writ(workdir, backend, f"sqlite:///{workdir / 'writ.db'}", auth=auth) as g:
            yield g


def signed_in_by_hand(gateway: Writ, name: str, user: int = 0) -> tuple[str, dict[str, Any]]:
    """A client registered at /register and signed in through the built-in login as `user`
    (0: demo-agent, 1: demo-admin): its id and its tokens."""
    client_id = register(gateway.url, client_name=name)["client_id"]
    pkce = Pkce.make()
    code = redirected(sign_in(gateway.url, params_for(client_id, pkce), user=user))["code"]
    tokens = exchange(gateway.url, client_id, code, pkce.verifier)
    assert tokens.status_code == 200, tokens.text
    return client_id, tokens.json()


def api(gateway: Writ, method: str, path: str, token: str | None, **kwargs: Any) -> httpx2.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx2.request(method, f"{gateway.url}{path}", headers=headers, timeout=10, **kwargs)


def client_path(client_id: str) -> str:
    return f"/api/oauth/clients/{quote(client_id, safe='')}"


def revocations(gateway: Writ) -> list[dict[str, Any]]:
    return [
        dict(e.payload)
        for e in gateway.runtime.store.events(tenant="acme")
        if e.type == "oauth.client_revoked"
    ]


async def test_the_sdk_client_signs_in_by_its_metadata_document_and_loses_its_tokens_when_revoked(
    gateway: Writ, host: DocumentsHost, callback: Callback, browser: Browser
) -> None:
    client_id = host.publish(
        "/apps/sdk-client.json",
        {
            "client_name": "SDK by document",
            "redirect_uris": [callback.uri],
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
            "token_endpoint_auth_method": "none",
        },
    )
    page: Page = await (await browser.new_context()).new_page()
    page.set_default_timeout(WAIT_S * 1000)
    sign_ins = 0

    async def open_in_browser(url: str) -> None:
        nonlocal sign_ins
        sign_ins += 1
        if sign_ins > 1:
            raise RuntimeError("the client was sent to sign in again")
        await page.goto(url)
        await page.click("#user-demo-agent")
        await expect(page.locator("#client-name")).to_have_text("SDK by document")
        await expect(page.locator("#client-host")).to_have_text("127.0.0.1")
        await expect(page.locator("#client-id")).to_have_text(client_id)
        await page.click("#allow")
        await expect(page.locator("#done")).to_be_visible()

    async def code_from_redirect() -> AuthorizationCodeResult:
        back = await callback.next()
        return AuthorizationCodeResult(code=back["code"], state=back.get("state"), iss=back.get("iss"))

    storage = Storage()
    metadata = OAuthClientMetadata(
        redirect_uris=[AnyUrl(callback.uri)],
        client_name="SDK by document",
        grant_types=["authorization_code", "refresh_token"],
        response_types=["code"],
        token_endpoint_auth_method="none",
    )
    auth = OAuthClientProvider(
        gateway.mcp_url, metadata, storage, open_in_browser, code_from_redirect, client_metadata_url=client_id
    )
    async with signed_in_client(auth, gateway.mcp_url) as client:
        looked_up = await client.call_tool("lookup_order", {"order_id": "1001"})
        first = storage.tokens
        auth.context.token_expiry_time = time.time() - 1
        again = await client.call_tool("lookup_order", {"order_id": "1002"})
    assert looked_up.is_error is False and again.is_error is False
    assert storage.client is not None and storage.client.client_id == client_id, (
        "no /register: the URL is the id"
    )
    assert (
        first is not None and storage.tokens is not None and storage.tokens.access_token != first.access_token
    )
    call = gateway.runtime.store.get_call(again.meta["writ/toolCallId"])  # type: ignore[index]
    assert call is not None and call.principal is not None and call.principal.client_id == client_id

    admin = gateway.token("root", roles="admin", tenant="acme")
    shown = api(gateway, "GET", client_path(client_id), admin).json()
    assert (shown["name"], shown["kind"], shown["liveSignIns"]) == ("SDK by document", "metadata_document", 1)
    assert [s["subject"] for s in shown["signIns"]] == ["demo-agent"]
    assert api(gateway, "GET", f"/api/oauth/clients/{client_id}", admin).json() == shown, "the URL as it is"
    revoked = api(gateway, "POST", f"{client_path(client_id)}/revoke", admin, json={"reason": "test"})
    assert revoked.status_code == 200 and revoked.json()["signInsEnded"] == 1

    # The access token is refused at once, without waiting for it to expire.
    assert tools_list(gateway.mcp_url, storage.tokens.access_token).status_code == 401
    # Through the SDK: its refresh is refused, and it is sent to sign in again, which this test refuses.
    old_refresh = storage.tokens.refresh_token
    assert old_refresh is not None
    auth.context.token_expiry_time = time.time() - 1
    with pytest.raises(BaseException):  # noqa: B017 (the SDK wraps the handler's error in groups)
        async with signed_in_client(auth, gateway.mcp_url) as client:
            await client.call_tool("lookup_order", {"order_id": "1003"})
    assert sign_ins == 2, "the SDK had to start a new sign-in"
    tried = gateway.runtime.store.find_refresh_token(old_refresh)
    assert tried is not None and tried.used_at is not None, "the SDK's refresh reached /token and was refused"
    assert revocations(gateway)[-1] | {"reason": "test"} == {
        "client_id": client_id,
        "client_name": "SDK by document",
        "revoked_by": "root",
        "sign_ins_ended": 1,
        "reason": "test",
        "break_glass": False,
    }


def test_an_admin_lists_the_clients_of_the_tenant_and_revokes_one_through_the_api(gateway: Writ) -> None:
    client_id, tokens = signed_in_by_hand(gateway, "API case")
    assert tools_list(gateway.mcp_url, tokens["access_token"]).status_code != 401, "taken before"
    other_id, other_tokens = signed_in_by_hand(gateway, "bystander")
    admin = gateway.token("root", roles="admin", tenant="acme")

    listed = api(gateway, "GET", "/api/oauth/clients", admin)
    assert listed.status_code == 200
    by_id = {c["clientId"]: c for c in listed.json()["clients"]}
    assert by_id[client_id]["name"] == "API case" and by_id[client_id]["liveSignIns"] == 1
    assert by_id[client_id]["kind"] == "registered"
    # Its refresh token ends a day after the login (sign_in_max_age_s), not 30 days after its issue.
    (sign_in,) = api(gateway, "GET", client_path(client_id), admin).json()["signIns"]
    ends, began = (datetime.fromisoformat(sign_in[k]) for k in ("refreshExpiresAt", "signedInAt"))
    lasts = ends - began
    assert timedelta(hours=23) < lasts <= timedelta(days=1)

    revoked = api(gateway, "POST", f"{client_path(client_id)}/revoke", admin)

    assert revoked.status_code == 200 and revoked.json()["signInsEnded"] == 1
    assert tools_list(gateway.mcp_url, tokens["access_token"]).status_code == 401
    assert refresh(gateway.url, client_id, tokens["refresh_token"]).json()["error"] == "invalid_grant"
    # Another client's sign-in is untouched.
    assert tools_list(gateway.mcp_url, other_tokens["access_token"]).status_code != 401
    assert refresh(gateway.url, other_id, other_tokens["refresh_token"]).status_code == 200
    after = api(gateway, "GET", client_path(client_id), admin).json()
    assert (after["liveSignIns"], after["signIns"]) == (0, [])


def test_the_clients_api_refuses_without_a_token_without_the_admin_role_and_across_tenants(
    gateway: Writ,
) -> None:
    client_id, tokens = signed_in_by_hand(gateway, "guarded")
    path = client_path(client_id)

    assert api(gateway, "GET", "/api/oauth/clients", None).status_code == 401
    agent = gateway.token("ann", roles="agent", tenant="acme")
    refused = api(gateway, "POST", f"{path}/revoke", agent)
    assert refused.status_code == 403 and refused.json()["error"] == "insufficient_role"
    elsewhere = gateway.token("olga", roles="admin", tenant="other")
    assert api(gateway, "GET", "/api/oauth/clients", elsewhere).json()["clients"] == []
    assert api(gateway, "GET", path, elsewhere).status_code == 404
    missing = api(gateway, "POST", f"{path}/revoke", elsewhere)
    assert missing.status_code == 404 and missing.json()["error"] == "not_found"
    admin = gateway.token("root", roles="admin", tenant="acme")
    bad = api(gateway, "POST", f"{path}/revoke", admin, json={"reason": "x", "extra": 1})
    assert bad.status_code == 400
    # None of these ended the sign-in.
    assert tools_list(gateway.mcp_url, tokens["access_token"]).status_code != 401


def test_the_cli_lists_shows_and_revokes_a_client_break_glass(gateway: Writ) -> None:
    client_id, tokens = signed_in_by_hand(gateway, "CLI case")
    assert tools_list(gateway.mcp_url, tokens["access_token"]).status_code != 401, "taken before"
    runner = CliRunner()
    config = ["--config", str(gateway.config)]

    listed = runner.invoke(app, ["oauth", "clients", "list", "--tenant", "acme", *config])
    shown = runner.invoke(app, ["oauth", "clients", "show", client_id, *config])
    unasked = runner.invoke(app, ["oauth", "clients", "revoke", client_id, "--tenant", "acme", *config])
    revoked = runner.invoke(
        app,
        [
            "oauth",
            "clients",
            "revoke",
            client_id,
            "--tenant",
            "acme",
            "--break-glass",
            "--reason",
            "leak",
            *config,
        ],
    )

    assert listed.exit_code == 0 and client_id in listed.output and "CLI case" in listed.output
    assert shown.exit_code == 0 and "demo-agent tenant=acme" in shown.output, shown.output
    assert unasked.exit_code != 0 and "no token was given" in unasked.output
    assert revoked.exit_code == 0 and "ended 1 sign-in" in revoked.output, revoked.output
    assert tools_list(gateway.mcp_url, tokens["access_token"]).status_code == 401
    last = revocations(gateway)[-1]
    assert (last["client_id"], last["break_glass"], last["reason"]) == (client_id, True, "leak")
    assert last["revoked_by"].startswith("operator:")
    unknown = runner.invoke(app, ["oauth", "clients", "show", "no-such-client", *config])
    assert unknown.exit_code == 1 and "no OAuth client no-such-client" in unknown.output


def test_the_cli_revokes_with_an_admin_token_for_its_own_tenant_only(gateway: Writ) -> None:
    client_id, tokens = signed_in_by_hand(gateway, "CLI token case")
    runner = CliRunner()
    config = ["--config", str(gateway.config)]
    revoke = ["oauth", "clients", "revoke", client_id, *config]

    agent = runner.invoke(app, [*revoke, "--token", gateway.token("ann", roles="agent", tenant="acme")])
    elsewhere = runner.invoke(
        app, [*revoke, "--tenant", "acme", "--token", gateway.token("olga", roles="admin", tenant="other")]
    )
    assert agent.exit_code != 0 and "insufficient_role" in agent.output, agent.output
    assert elsewhere.exit_code != 0 and "other_tenant" in elsewhere.output, elsewhere.output
    assert tools_list(gateway.mcp_url, tokens["access_token"]).status_code != 401, "nothing ended yet"

    done = runner.invoke(app, [*revoke, "--token", gateway.token("root", roles="admin", tenant="acme")])

    assert done.exit_code == 0 and "by root: ended 1 sign-in" in done.output, done.output
    assert tools_list(gateway.mcp_url, tokens["access_token"]).status_code == 401
    last = revocations(gateway)[-1]
    assert (last["client_id"], last["revoked_by"], last["break_glass"]) == (client_id, "root", False)


async def test_an_admin_revokes_a_client_from_the_console(gateway: Writ, browser: Browser) -> None:
    client_id, tokens = signed_in_by_hand(gateway, "Console case")
    assert tools_list(gateway.mcp_url, tokens["access_token"]).status_code != 401, "taken before"
    page = await (await browser.new_context()).new_page()
    page.set_default_timeout(WAIT_S * 1000)
    await page.goto(f"{gateway.url}/console/login")
    await page.fill("#token", gateway.token("root", roles="admin", tenant="acme"))
    await page.click("#login")
    await page.click("nav >> text=Clients")
    card = page.locator(f"article.client[data-client-id='{client_id}']")
    await expect(card.locator("h2")).to_contain_text("Console case")
    await expect(card.locator("tr.sign-in")).to_contain_text("demo-agent")

    await card.locator("input[name=reason]").fill("phone lost")
    await card.locator("button[type=submit]").click()

    await expect(page.locator("#done")).to_have_text(f"Ended 1 sign-in of {client_id}.")
    await expect(page.locator(f"article.client[data-client-id='{client_id}'] .live")).to_have_text("0")
    assert tools_list(gateway.mcp_url, tokens["access_token"]).status_code == 401
    last = revocations(gateway)[-1]
    assert (last["client_id"], last["revoked_by"], last["reason"]) == (client_id, "root", "phone lost")


async def test_the_clients_page_is_for_admins_only(gateway: Writ, browser: Browser) -> None:
    page = await (await browser.new_context()).new_page()
    page.set_default_timeout(WAIT_S * 1000)
    await page.goto(f"{gateway.url}/console/login")
    await page.fill("#token", gateway.token("appy", roles="approver", tenant="acme"))
    await page.click("#login")
    await expect(page.locator("nav")).not_to_contain_text("Clients")

    response = await page.goto(f"{gateway.url}/console/clients")

    assert response is not None and response.status == 403
    await expect(page.locator(".error")).to_have_text("The clients page needs the admin role.")
