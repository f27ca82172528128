"""Signing in through an upstream OpenID provider with no registration endpoint, run as a real process
(`oidc_provider.py`, Writ registered there statically): the official SDK's OAuth client registers
with Writ, the browser (Chromium) goes through Writ to the provider's login form and back to Writ's
consent, and the principal's tenant and roles come from the provider's claims. Each refusal (a
callback of another state, the provider's `access_denied`, an ID token for another audience or
nonce, a claim not allowed, an unknown or unreachable provider) is driven in plain HTTP, and so are
two replicas on one PostgreSQL database taking turns through one sign-in. The gateways run in-process
(`inproc.py`); the provider is a process, and so is the browser."""

from __future__ import annotations

import contextlib
import html
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import anyio
import httpx2
import pytest
import uvicorn
from mcp.client.auth import OAuthClientProvider
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientMetadata
from playwright.async_api import Browser, expect
from pydantic import AnyUrl
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Route

from gateway.audit.security import SecurityEvents
from store import EventFilter
from tests.e2e.harness import demo_config, free_port
from tests.eventually import eventually_sync
from tests.gateway.mcp.inproc import Backend, Writ, acme, served, serving
from tests.gateway.oauth.flow import (
    REDIRECT,
    Pkce,
    authorization_params,
    csrf_of,
    exchange,
    register,
)
from tests.gateway.oauth.idp_process import CLIENT_ID, SECRET, Idp, idp
from tests.gateway.oauth.test_sign_in import WAIT_S, Callback, Storage, signed_in_client
from tests.postgres import fresh_schema

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


@dataclass
class Gateways:
    one: Writ
    """One provider (`corp`): /authorize goes straight to it."""
    two: Writ
    """Two providers, `corp` and `down` (nothing listens there): a page to choose."""
    idp: Idp
    backend: Backend
    replicas_url: str
    """The public URL of the replicas' case, whose callback the provider knows too."""


def provider(issuer: str, workdir: Path, **extra: Any) -> dict[str, Any]:
    secret = workdir / "idp-secret"
    secret.write_text(SECRET + "\n")
    return {
        "id": "corp",
        "name": "Example IdP",
        "issuer": issuer,
        "client_id": CLIENT_ID,
        "client_secret_file": str(secret),
        "claims": {"tenant": "org", "roles": "realm_access.roles"},
        "required_claims": {"org": ["acme", "initech"]},
        **extra,
    }


def config(
    workdir: Path,
    port: int,
    backend: str,
    providers: list[dict[str, Any]],
    *,
    store_url: str | None = None,
    key_file: Path | None = None,
    public_url: str | None = None,
) -> Path:
    server = {
        "enabled": True,
        "key_file": str(key_file or workdir / "oauth-keys.json"),
        "login": {"type": "oidc", "providers": providers},
    }
    return demo_config(
        workdir,
        gateway_port=port,
        backend_url=backend,
        store_url=store_url or f"sqlite:///{workdir / 'writ.db'}",
        auth={"authorization_server": server},
        server={"public_url": public_url} if public_url else None,
    )


@pytest.fixture(scope="module")
def gateways(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateways]:
    ports = free_port(), free_port(), free_port()
    callbacks = [f"http://127.0.0.1:{p}/authorize/oidc/corp/callback" for p in ports]
    with idp(callbacks) as provider_process, contextlib.ExitStack() as stack:
        issuer = provider_process.issuer
        backend = stack.enter_context(acme(tmp_path_factory.mktemp("acme")))
        one_dir, two_dir = tmp_path_factory.mktemp("one"), tmp_path_factory.mktemp("two")
        down = {"id": "down", "name": "Unreachable IdP", "issuer": f"http://127.0.0.1:{free_port()}"}
        down |= {"client_id": "writ", "token_endpoint_auth_method": "none"}
        one_path = config(one_dir, ports[0], backend.url, [provider(issuer, one_dir)])
        two_path = config(two_dir, ports[1], backend.url, [provider(issuer, two_dir), down])
        one = stack.enter_context(served(one_path, one_dir))
        two = stack.enter_context(served(two_path, two_dir))
        yield Gateways(one, two, provider_process, backend, f"http://127.0.0.1:{ports[2]}")


@pytest.fixture(scope="module")
def client_id(gateways: Gateways) -> str:
    return str(register(gateways.one.url)["client_id"])


# -- the whole way, with the official client and a browser ----------------------------------------


@pytest.fixture
def callback() -> Iterator[Callback]:
    port = free_port()
    target = Callback(f"http://127.0.0.1:{port}/callback")

    async def arrived(request: Request) -> HTMLResponse:
        target.received.put(dict(request.query_params))
        return HTMLResponse("<p id=done>Signed in. You can close this window.</p>")

    app = Starlette(routes=[Route("/callback", arrived)])
    with serving(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")):
        yield target


async def test_the_sdk_client_signs_in_at_the_provider_calls_tools_as_its_claims_say_and_refreshes(
    gateways: Gateways, browser: Browser, callback: Callback
) -> None:
    gateway = gateways.one
    page = await (await browser.new_context()).new_page()
    page.set_default_timeout(WAIT_S * 1000)

    async def open_in_browser(url: str) -> None:
        await page.goto(url)
        await expect(page.locator("#idp")).to_have_text("Example identity provider")
        await page.fill("#username", "alice")
        await page.fill("#password", "alice-password")
        await page.click("#login")
        await expect(page.locator("#client-name")).to_have_text("Writ upstream test")
        await expect(page.locator("#acting-as")).to_have_text(
            "alice@example.test · tenant acme · roles agent"
        )
        await expect(page.locator("#redirect-uri")).to_have_text(callback.uri)
        await page.click("#allow")
        await expect(page.locator("#done")).to_be_visible()

    async def code_from_redirect() -> AuthorizationCodeResult:
        params = await callback.next()
        return AuthorizationCodeResult(code=params["code"], state=params.get("state"), iss=params.get("iss"))

    metadata = OAuthClientMetadata(
        redirect_uris=[AnyUrl(callback.uri)],
        client_name="Writ upstream test",
        grant_types=["authorization_code", "refresh_token"],
        response_types=["code"],
        token_endpoint_auth_method="none",
    )
    storage = Storage()
    auth = OAuthClientProvider(gateway.mcp_url, metadata, storage, open_in_browser, code_from_redirect)
    exchanged = gateways.idp.token_requests()
    async with signed_in_client(auth, gateway.mcp_url) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        looked_up = await client.call_tool("lookup_order", {"order_id": "1001"})
        assert storage.tokens is not None and storage.client is not None
        first = storage.tokens
        auth.context.token_expiry_time = time.time() - 1  # forced to run out: the client refreshes
        again = await client.call_tool("lookup_order", {"order_id": "1002"})
    assert {"lookup_order", "refund_order"} <= names
    assert looked_up.is_error is False and again.is_error is False
    assert storage.tokens.access_token != first.access_token
    assert gateways.idp.token_requests() == exchanged + 1, (
        "one code exchanged at the provider; refresh at Writ"
    )
    for result in (looked_up, again):
        call = gateway.runtime.store.get_call(result.meta["writ/toolCallId"])
        assert call is not None and call.principal is not None
        assert (call.tenant, call.subject) == ("acme", "alice@example.test")
        assert set(call.principal.roles) == {"agent"}
        assert set(call.principal.groups) == {"payments"}


# -- each step refused, in plain HTTP -------------------------------------------------------------


@dataclass
class AtProvider:
    """A sign-in sent to the provider's login form: the browser (cookies kept) and its form."""

    browser: httpx2.Client
    form: dict[str, str]
    idp: str

    def login(
        self, user: str = "alice", password: str | None = None, action: str = "login"
    ) -> httpx2.Response:
        """The provider's answer to the form: a redirect back to Writ's callback, not yet followed."""
        data = self.form | {"username": user, "password": password or f"{user}-password", "action": action}
        answer = self.browser.post(f"{self.idp}/authorize", data=data)
        assert answer.status_code == 302, answer.text
        return answer

    def back_at_writ(self, answer: httpx2.Response) -> httpx2.Response:
        return self.browser.get(answer.headers["location"])


@contextlib.contextmanager
def to_provider(gateway: Writ, client_id: str) -> Iterator[AtProvider]:
    with httpx2.Client(timeout=10) as browser:
        sent = browser.get(f"{gateway.url}/authorize", params=authorization_params(client_id, Pkce.make()))
        assert sent.status_code == 302, sent.text
        form = browser.get(sent.headers["location"])
        assert form.status_code == 200 and 'id="username"' in form.text, form.text
        fields = dict(_hidden_fields(form.text))
        at = urlsplit(sent.headers["location"])
        yield AtProvider(browser, fields, f"{at.scheme}://{at.netloc}")


def _hidden_fields(page: str) -> Iterator[tuple[str, str]]:
    for name, value in re.findall(r'type="hidden" name="([^"]+)" value="([^"]*)"', page):
        yield name, html.unescape(value)


def to_client(response: httpx2.Response) -> dict[str, str]:
    assert response.status_code == 302, response.text
    location = response.headers["location"]
    assert location.startswith(REDIRECT + "?"), location
    return {k: v[0] for k, v in parse_qs(urlsplit(location).query).items()}


def test_the_redirect_to_the_provider_carries_pkce_s256_a_state_and_a_nonce(
    gateways: Gateways, client_id: str
) -> None:
    with to_provider(gateways.one, client_id) as at:
        assert at.form["code_challenge_method"] == "S256" and len(at.form["code_challenge"]) == 43
        assert at.form["client_id"] == "writ-gateway"
        assert at.form["redirect_uri"] == f"{gateways.one.url}/authorize/oidc/corp/callback"
        assert len(at.form["state"]) >= 32 and len(at.form["nonce"]) >= 32
        consent = at.back_at_writ(at.login())
        assert consent.status_code == 200 and 'id="allow"' in consent.text
        decided = at.browser.post(
            f"{gateways.one.url}/authorize/consent", data={"csrf": csrf_of(consent.text), "decision": "allow"}
        )
    assert "code" in to_client(decided)


def refused_upstream(gateways: Gateways, kind: str, at_least: int = 0) -> int:
    """How many sign-ins `security.oauth_refused` events of `kind` stand for, once all are written;
    checks that each names the provider's issuer and the browser's address, and no code or token."""
    security = gateways.one.runtime.security
    assert isinstance(security, SecurityEvents)
    anyio.run(lambda: security.tick(flush_all=True))

    def payloads() -> list[dict[str, Any]]:
        found = gateways.one.runtime.store.export(EventFilter(types=("security.oauth_refused",)))
        return [e["payload"] for e in found if e["payload"]["kind"] == kind]

    # The gateway's own pass may have taken some an instant before and be writing them still.
    events = eventually_sync(payloads, lambda found: sum(int(p["count"]) for p in found) >= at_least)
    assert all(p["source"] == "127.0.0.1" and p["issuer"] == gateways.idp.issuer for p in events)
    assert all(set(p) & {"code", "state", "id_token"} == set() for p in events)
    return sum(int(p["count"]) for p in events)


def test_a_callback_with_another_state_ends_on_a_page_and_the_client_hears_nothing(
    gateways: Gateways, client_id: str
) -> None:
    exchanged = gateways.idp.token_requests()
    before = refused_upstream(gateways, "upstream_bad_state")
    with to_provider(gateways.one, client_id) as at:
        answer = at.login()
        location = answer.headers["location"].replace(f"state={at.form['state']}", "state=forged")
        page = at.browser.get(location)
    assert page.status_code == 400
    assert "does not belong to the sign-in this browser started" in page.text
    assert gateways.idp.token_requests() == exchanged, "no code was exchanged"
    assert refused_upstream(gateways, "upstream_bad_state", before + 1) == before + 1
    # A browser that started no sign-in at all (a callback link sent to someone else) gets a page too.
    with httpx2.Client(timeout=10) as stranger:
        page = stranger.get(answer.headers["location"])
    assert page.status_code == 400 and "expired or was not started in this browser" in page.text


def test_an_answer_naming_another_issuer_at_the_callback_is_access_denied(
    gateways: Gateways, client_id: str
) -> None:
    exchanged = gateways.idp.token_requests()
    before = refused_upstream(gateways, "upstream_issuer_mismatch")
    with to_provider(gateways.one, client_id) as at:
        answer = at.login()
        location = answer.headers["location"]
        assert "iss=" in location, "the test provider says who answers (RFC 9207)"
        mixed_up = re.sub(r"iss=[^&]*", "iss=https%3A%2F%2Fattacker.example", location)
        params = to_client(at.browser.get(mixed_up))
    assert params["error"] == "access_denied" and "names another issuer" in params["error_description"]
    assert gateways.idp.token_requests() == exchanged, "the code was not sent anywhere"
    assert refused_upstream(gateways, "upstream_issuer_mismatch", before + 1) == before + 1


def test_the_provider_saying_access_denied_sends_access_denied_to_the_client(
    gateways: Gateways, client_id: str
) -> None:
    with to_provider(gateways.one, client_id) as at:
        answer = at.login(action="cancel")
        assert "error=access_denied" in answer.headers["location"]
        params = to_client(at.back_at_writ(answer))
    assert params["error"] == "access_denied"
    assert (
        params["state"] == "st-1"
        and params["iss"] == gateways.one.runtime.authorization_server.settings.issuer
    )  # type: ignore[union-attr]
    assert "Example IdP answered access_denied" in params["error_description"]
    assert "code" not in params


@pytest.mark.parametrize(
    ("claims", "claim"),
    [
        ({"aud": "another-client"}, "aud"),
        ({"nonce": "a-nonce-of-another-sign-in"}, "nonce"),
        ({"iss": "http://evil.test"}, "iss"),
    ],
)
def test_an_id_token_for_another_audience_nonce_or_issuer_is_access_denied(
    gateways: Gateways, client_id: str, claims: dict[str, str], claim: str
) -> None:
    before = refused_upstream(gateways, "upstream_refused")
    with to_provider(gateways.one, client_id) as at:
        answer = at.login()
        gateways.idp.next_id_token(**claims)
        params = to_client(at.back_at_writ(answer))
    assert params["error"] == "access_denied"
    assert f"the ID token is refused: its {claim} claim is not accepted" in params["error_description"]
    assert "code" not in params
    assert refused_upstream(gateways, "upstream_refused", before + 1) == before + 1


def test_an_id_token_whose_claims_are_not_allowed_here_is_access_denied(
    gateways: Gateways, client_id: str
) -> None:
    with to_provider(gateways.one, client_id) as at:
        params = to_client(at.back_at_writ(at.login("eve")))  # org globex; the config wants acme or initech
    assert params["error"] == "access_denied"
    assert "org claim is not one allowed here" in params["error_description"]


def test_a_provider_failing_at_its_token_endpoint_is_temporarily_unavailable_to_the_client(
    gateways: Gateways, client_id: str
) -> None:
    with to_provider(gateways.one, client_id) as at:
        answer = at.login()
        gateways.idp.fail_next_token_request(503)
        params = to_client(at.back_at_writ(answer))
    assert params["error"] == "temporarily_unavailable"
    assert "Example IdP cannot be reached" in params["error_description"] and "code" not in params


def test_an_unknown_provider_is_a_page_saying_so(gateways: Gateways, client_id: str) -> None:
    with httpx2.Client(timeout=10) as browser:
        browser.get(f"{gateways.two.url}/authorize", params=authorization_params(client_id, Pkce.make()))
        for path in ("/authorize/oidc/nobody", "/authorize/oidc/nobody/callback?code=x&state=y"):
            page = browser.get(f"{gateways.two.url}{path}")
            assert page.status_code == 404 and "no identity provider of that name" in page.text, path


def test_with_two_providers_a_page_lets_the_person_choose_and_an_unreachable_one_says_so(
    gateways: Gateways,
) -> None:
    gateway = gateways.two
    client = register(gateway.url)["client_id"]
    with httpx2.Client(timeout=10) as browser:
        chooser = browser.get(f"{gateway.url}/authorize", params=authorization_params(client, Pkce.make()))
        assert chooser.status_code == 200
        assert "Example IdP" in chooser.text and "Unreachable IdP" in chooser.text
        csrf = parse_qs(urlsplit(_link(chooser.text, "corp")).query)["csrf"][0]
        forged = browser.get(f"{gateway.url}/authorize/oidc/corp", params={"csrf": "forged"})
        assert forged.status_code == 400 and "expired" in forged.text
        down = browser.get(f"{gateway.url}{_link(chooser.text, 'down')}")
        assert down.status_code == 502 and "Unreachable IdP cannot be reached" in down.text
        sent = browser.get(f"{gateway.url}/authorize/oidc/corp", params={"csrf": csrf})
        assert sent.status_code == 302 and sent.headers["location"].startswith(
            f"{gateways.idp.issuer}/authorize?"
        )


def _link(page: str, provider: str) -> str:
    found = re.search(rf'id="provider-{provider}" href="([^"]+)"', page)
    assert found, page
    return html.unescape(found.group(1))


@pytest.mark.postgres
def test_each_step_through_the_provider_can_land_on_another_replica(
    gateways: Gateways, tmp_path_factory: pytest.TempPathFactory, postgres_url: str
) -> None:
    """Two gateways behind one public URL, on one PostgreSQL database and one key file: /authorize at
    one, the provider's callback at the other, the consent at the first, the code at the second."""
    root = tmp_path_factory.mktemp("replicas")
    with fresh_schema(postgres_url, "writ_upstream") as url, contextlib.ExitStack() as stack:
        a, b = (
            stack.enter_context(served(path, path.parent))
            for path in (
                config(
                    root / name,
                    free_port(),
                    gateways.backend.url,
                    [provider(gateways.idp.issuer, _made(root / name))],
                    store_url=url,
                    key_file=root / "shared-oauth-keys.json",
                    public_url=gateways.replicas_url,
                )
                for name in ("a", "b")
            )
        )
        client = register(a.url)["client_id"]
        pkce = Pkce.make()
        with httpx2.Client(timeout=10) as browser:  # cookies go by host, not port: one browser, two replicas
            sent = browser.get(f"{a.url}/authorize", params=authorization_params(client, pkce))
            form = dict(_hidden_fields(browser.get(sent.headers["location"]).text))
            data = form | {"username": "bob", "password": "bob-password", "action": "login"}
            answer = browser.post(f"{gateways.idp.issuer}/authorize", data=data)
            callback = answer.headers["location"].replace(gateways.replicas_url, b.url)
            consent = browser.get(callback)
            assert (
                consent.status_code == 200
                and "bob@example.test · tenant acme · roles approver" in consent.text
            )
            decided = browser.post(
                f"{a.url}/authorize/consent", data={"csrf": csrf_of(consent.text), "decision": "allow"}
            )
        tokens = exchange(b.url, client, to_client(decided)["code"], pkce.verifier).json()
        for replica in (a, b):
            verified = anyio.run(replica.runtime.verifier.verify_token, tokens["access_token"])
            assert verified is not None
            principal = replica.runtime.principal_from_claims(verified.claims or {})
            assert (principal.subject, principal.tenant) == ("bob@example.test", "acme")
            assert principal.roles == frozenset({"approver"})


def _made(directory: Path) -> Path:
    directory.mkdir(exist_ok=True)
    return directory
