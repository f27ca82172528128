"""The web console in a real browser (Debian's Chromium driven by Playwright, hence e2e) against the whole
gateway served in this process (`inproc_sqlite_gateway`, the CLI run by its own `main`)."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta

import httpx2
import pytest
from playwright.async_api import Browser, Page, expect

from store import PrincipalRecord
from store.console_sessions import ConsoleSession
from tests.e2e.harness import Backend, Gateway
from tests.e2e.test_approvals import request_refund

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


async def logged_in(browser: Browser, gateway: Gateway, token: str) -> Page:
    page = await (await browser.new_context()).new_page()
    page.set_default_timeout(20_000)
    await page.goto(f"{gateway.url}/console")
    await expect(page).to_have_url(f"{gateway.url}/console/login")
    await page.fill("#token", token)
    await page.click("#login")
    await expect(page).to_have_url(f"{gateway.url}/console/inbox")
    return page


HOUR = timedelta(hours=1)
OTHER_PORT = "http://127.0.0.1:18901"
"""A page on another port of the console's host: cookies ignore ports, so it can set the console's."""


def from_console(gateway: Gateway) -> dict[str, str]:
    """The headers a browser sends with a form posted from the console's own page."""
    return {"Origin": gateway.url, "Sec-Fetch-Site": "same-origin"}


async def signed_in(gateway: Gateway, token: str) -> tuple[dict[str, str], str]:
    """The cookies a browser holds once logged in with `token`, and the CSRF token its pages carry."""
    async with httpx2.AsyncClient(timeout=10) as browser:
        login = await browser.post(
            f"{gateway.url}/console/login", data={"token": token}, headers=from_console(gateway)
        )
        assert login.status_code == 303, login.text
        page = await browser.get(f"{gateway.url}/console/inbox")
        found = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert found is not None, page.text
        return dict(browser.cookies), found.group(1)


async def post_decision(
    gateway: Gateway, approval_id: str, cookies: dict[str, str], csrf: str, headers: dict[str, str]
) -> httpx2.Response:
    """An approval posted with exactly these cookies, CSRF field and headers."""
    cookie = "; ".join(f"{name}={value}" for name, value in cookies.items())
    async with httpx2.AsyncClient(timeout=10) as http:
        return await http.post(
            f"{gateway.url}/console/approvals/{approval_id}/decision",
            data={"decision": "approve", "csrf": csrf},
            headers={"Cookie": cookie, **headers},
        )


def approval_status(gateway: Gateway, approval_id: str) -> str:
    with gateway.store() as store:
        approval = store.get_approval(approval_id)
    assert approval is not None
    return approval.status


async def test_an_approver_approves_a_pending_refund_in_the_inbox_and_sees_it_complete(
    inproc_sqlite_gateway: Gateway, inproc_sqlite_backend: Backend, browser: Browser
) -> None:
    gateway, backend = inproc_sqlite_gateway, inproc_sqlite_backend
    pending = await request_refund(gateway, "console-1")
    page = await logged_in(browser, gateway, gateway.token("bob", roles="approver"))

    card = page.locator(f"article#{pending['approvalId']}")
    await expect(card.locator(".summary")).to_have_text("refund 250 EUR to order 1002")
    await expect(card.locator(".capability")).to_have_text("refund-order@2")
    await expect(card.locator(".requester")).to_have_text("alice")
    await expect(card.locator(".rule")).to_contain_text("refunds-over-100-need-approval")
    await expect(card.locator(".rule")).to_contain_text("amount_over_approval_threshold")
    await expect(card.locator(".rule")).to_contain_text("(also matched: agents-refund)")
    assert (await card.locator(".rule").inner_text()).count("refunds-over-100-need-approval") == 1
    await expect(card.locator("tr[data-name=amount] td")).to_have_text("250")
    await expect(card.locator("tr[data-name=order_id] td")).to_have_text("1002")
    await expect(card.locator("time.countdown")).to_contain_text("59m")

    await card.locator("input[name=reason]").fill("photos of the damage attached")
    await card.locator("button.approve").click()

    await expect(page).to_have_url(f"{gateway.url}/console/calls/{pending['toolCallId']}")
    await expect(page.locator("#call-status")).to_have_text("completed")
    timeline = page.locator("#timeline li")
    await expect(timeline.locator("strong")).to_have_text(
        [
            "tool_call.requested",
            "approval.required",
            "approval.granted",
            "tool_call.dispatching",
            "tool_call.completed",
        ]
    )
    await expect(page.locator("#timeline li[data-type='approval.granted']")).to_contain_text("decided_by=bob")
    assert len(backend.refunds("console-1")) == 1


async def test_an_approved_call_the_backend_refuses_shows_the_failure_not_the_approvals_reason(
    inproc_sqlite_gateway: Gateway, browser: Browser
) -> None:
    gateway = inproc_sqlite_gateway
    args = {"order_id": "1002", "amount": 250.005, "currency": "EUR", "reason": "damaged in transit"}
    async with gateway.client(gateway.token("alice")) as client:
        pending = (await client.call_tool("refund_order", args)).structured_content
    assert pending["status"] == "approval_pending"
    page = await logged_in(browser, gateway, gateway.token("bob", roles="approver"))
    await page.locator(f"article#{pending['approvalId']} button.approve").click()

    await expect(page).to_have_url(f"{gateway.url}/console/calls/{pending['toolCallId']}")
    await expect(page.locator("#call-status")).to_have_text("failed")
    await expect(page.locator("#call-status-note")).to_have_text("http_422")  # acme: three decimals
    await expect(page.locator("#call-policy")).to_contain_text(
        "require_approval (amount_over_approval_threshold)"
    )


async def test_the_requesters_own_approval_is_refused_in_the_page(
    inproc_sqlite_gateway: Gateway, inproc_sqlite_backend: Backend, browser: Browser
) -> None:
    gateway, backend = inproc_sqlite_gateway, inproc_sqlite_backend
    refunds = backend.refunds()
    pending = await request_refund(gateway, "console-2", roles="agent,approver")
    page = await logged_in(browser, gateway, gateway.token("alice", roles="agent,approver"))

    card = page.locator(f"article#{pending['approvalId']}")
    await expect(card.locator(".note")).to_contain_text("You requested this call")
    await card.locator("button.approve").click()

    await expect(page.locator(".error")).to_contain_text("self_approval_forbidden")
    await expect(page.locator(".error")).to_contain_text("does not let you approve it yourself")
    await expect(page.locator(f"article#{pending['approvalId']} .status")).to_have_text("awaiting_approval")
    assert backend.refunds() == refunds


async def test_a_decision_without_the_sessions_csrf_token_is_refused(
    inproc_sqlite_gateway: Gateway, browser: Browser
) -> None:
    gateway = inproc_sqlite_gateway
    pending = await request_refund(gateway, "console-3")
    page = await logged_in(browser, gateway, gateway.token("bob", roles="approver"))

    forged = await page.request.post(
        f"{gateway.url}/console/approvals/{pending['approvalId']}/decision",
        form={"decision": "approve", "csrf": "guessed"},
    )

    assert forged.status == 403
    await page.reload()
    await expect(page.locator(f"article#{pending['approvalId']} .status")).to_have_text("awaiting_approval")


async def test_a_bad_token_does_not_log_in(inproc_sqlite_gateway: Gateway, browser: Browser) -> None:
    gateway = inproc_sqlite_gateway
    page = await (await browser.new_context()).new_page()
    await page.goto(f"{gateway.url}/console/login")
    await page.fill("#token", "not-a-token")
    await page.click("#login")
    await expect(page.locator(".error")).to_contain_text("did not verify")
    await page.goto(f"{gateway.url}/console/inbox")
    await expect(page).to_have_url(f"{gateway.url}/console/login")


async def test_characters_that_hide_or_reorder_text_are_shown_as_code_points(
    inproc_sqlite_gateway: Gateway, browser: Browser
) -> None:
    # U+202E made the approver read order "1002" and reason "live" where "\u202e2001" and "\u202eevil"
    # would be sent; U+200B, U+FE0F (a variation selector) and U+3164 (a Hangul filler) are not seen.
    gateway = inproc_sqlite_gateway
    # A run of spaces and a newline are shown as they are, not collapsed as HTML would collapse them.
    order, reason = "\u202e2001\ufe0f", "\u202eevil\u200b\u3164  and\nmore"
    arguments = {"order_id": order, "amount": 250, "currency": "EUR", "reason": reason}
    async with gateway.client(gateway.token("alice")) as client:
        result = await client.call_tool("refund_order", arguments)
    pending = result.structured_content
    assert pending["status"] == "approval_pending", pending
    page = await logged_in(browser, gateway, gateway.token("bob", roles="approver"))
    await page.goto(f"{gateway.url}/console/approvals/{pending['approvalId']}")

    card = page.locator(f"article#{pending['approvalId']}")
    await expect(card.locator("tr[data-name=order_id] td")).to_have_text("<U+202E>2001<U+FE0F>")
    shown = await card.locator("tr[data-name=reason] td").inner_text()
    assert shown == "<U+202E>evil<U+200B><U+3164>  and\nmore"
    await expect(card.locator("h2.summary")).to_contain_text("to order <U+202E>2001<U+FE0F>")
    assert "<U+202E>2001<U+FE0F>" in gateway.cli("approvals", "list").stdout


def test_a_login_posted_from_another_site_port_or_subdomain_is_refused(
    inproc_sqlite_gateway: Gateway,
) -> None:
    # Login CSRF: a page elsewhere posts the attacker's token, and the approver's browser is then
    # logged in as the attacker. Another port of the console's host, or a sibling subdomain, is the
    # same site, and can plant cookies too.
    gateway = inproc_sqlite_gateway
    form = {"token": gateway.token("mallory", roles="approver")}
    url = f"{gateway.url}/console/login"
    for headers in (
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
        {"Origin": OTHER_PORT},
    ):
        forged = httpx2.post(url, data=form, headers=headers, timeout=10)
        assert forged.status_code == 403, headers
        assert "writ_session" not in forged.headers.get("set-cookie", ""), headers
    for headers in ({"Sec-Fetch-Site": "same-origin"}, from_console(gateway)):
        own = httpx2.post(url, data=form, headers=headers, timeout=10)
        assert own.status_code == 303 and "writ_session" in own.headers["set-cookie"], headers


async def test_a_csrf_value_of_the_attackers_choosing_decides_nothing_from_any_origin(
    inproc_sqlite_gateway: Gateway,
) -> None:
    # The reported forgery: the approver's own session, beside a CSRF cookie another port set and the
    # same value in the form. Refused from that port, and by the token alone where the origin check
    # cannot tell (the console's own Origin, or a browser that sends none).
    gateway = inproc_sqlite_gateway
    pending = await request_refund(gateway, "console-csrf-1")
    cookies, _ = await signed_in(gateway, gateway.token("bob", roles="approver"))
    planted = {"writ_session": cookies["writ_session"], "writ_csrf": "attackerknown"}

    for headers in ({"Origin": OTHER_PORT}, from_console(gateway), {}):
        forged = await post_decision(gateway, pending["approvalId"], planted, "attackerknown", headers)
        assert forged.status_code == 403 and "did not come from this console" in forged.text, headers
    assert approval_status(gateway, pending["approvalId"]) == "awaiting_approval"


async def test_the_csrf_token_of_another_session_is_refused(inproc_sqlite_gateway: Gateway) -> None:
    # Mallory's own session gives her a valid token, and any cookie it came with; neither is the
    # approver's, whose session cookie the browser sends beside them.
    gateway = inproc_sqlite_gateway
    pending = await request_refund(gateway, "console-csrf-3")
    bob, _ = await signed_in(gateway, gateway.token("bob", roles="approver"))
    mallory, mallory_csrf = await signed_in(gateway, gateway.token("mallory", roles="approver"))

    mixed = {**mallory, "writ_session": bob["writ_session"]}
    forged = await post_decision(gateway, pending["approvalId"], mixed, mallory_csrf, from_console(gateway))

    assert forged.status_code == 403
    assert approval_status(gateway, pending["approvalId"]) == "awaiting_approval"


async def test_the_sessions_own_token_is_refused_from_another_port_and_accepted_from_the_console(
    inproc_sqlite_gateway: Gateway,
) -> None:
    gateway = inproc_sqlite_gateway
    pending = await request_refund(gateway, "console-csrf-4")
    cookies, csrf = await signed_in(gateway, gateway.token("bob", roles="approver"))

    other_port = await post_decision(gateway, pending["approvalId"], cookies, csrf, {"Origin": OTHER_PORT})
    same_site = await post_decision(
        gateway, pending["approvalId"], cookies, csrf, {"Sec-Fetch-Site": "same-site"}
    )
    assert (other_port.status_code, same_site.status_code) == (403, 403)
    assert approval_status(gateway, pending["approvalId"]) == "awaiting_approval"

    own = await post_decision(gateway, pending["approvalId"], cookies, csrf, from_console(gateway))
    assert own.status_code == 303, own.text
    assert approval_status(gateway, pending["approvalId"]) == "approved"


def minted(
    gateway: Gateway, subject: str, *, ttl_s: int, roles: str = "approver", now: float | None = None
) -> str:
    """A token of the gateway's dev issuer valid for `ttl_s` (from `now`, by default now)."""
    config, issuer = gateway.issuing()
    assert issuer is not None
    return issuer.mint(
        subject=subject,
        audience=config.server.resource_url,
        tenant="acme",
        roles=[roles],
        ttl_s=ttl_s,
        now=now,
    )


def console_page(gateway: Gateway, cookie: str, path: str = "/console/inbox") -> httpx2.Response:
    """`path` fetched with exactly this session cookie."""
    return httpx2.get(f"{gateway.url}{path}", headers={"Cookie": f"writ_session={cookie}"}, timeout=10)


def test_the_session_cookie_is_a_session_id_never_the_bearer_token(inproc_sqlite_gateway: Gateway) -> None:
    # Cookies ignore ports: a server on another port of the host, under /console, receives this
    # cookie. It must not get a token that works on /mcp and /api.
    gateway = inproc_sqlite_gateway
    token = gateway.token("bob", roles="approver")

    login = httpx2.post(
        f"{gateway.url}/console/login", data={"token": token}, headers=from_console(gateway), timeout=10
    )

    assert login.status_code == 303, login.text
    set_cookies = login.headers.get_list("set-cookie")
    assert set_cookies and all(token not in c for c in set_cookies)
    for part in token.split("."):  # no piece of the JWT either: header, claims or signature
        assert all(part not in c for c in set_cookies)
    session_id = login.cookies["writ_session"]
    assert re.fullmatch(r"[A-Za-z0-9_-]{43}", session_id)  # secrets.token_urlsafe(32)
    (cookie,) = set_cookies
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/console" in cookie
    assert console_page(gateway, session_id).status_code == 200
    # The session id is no bearer token: /api refuses it.
    api = httpx2.get(
        f"{gateway.url}/api/approvals", headers={"Authorization": f"Bearer {session_id}"}, timeout=10
    )
    assert api.status_code == 401


async def test_logging_out_ends_the_session_and_a_replayed_cookie_lands_on_the_login_page(
    inproc_sqlite_gateway: Gateway,
) -> None:
    gateway = inproc_sqlite_gateway
    pending = await request_refund(gateway, "console-logout")
    cookies, csrf = await signed_in(gateway, gateway.token("bob", roles="approver"))
    copied = cookies["writ_session"]
    assert console_page(gateway, copied).status_code == 200

    logout = httpx2.post(
        f"{gateway.url}/console/logout",
        data={"csrf": csrf},
        headers={"Cookie": f"writ_session={copied}", **from_console(gateway)},
        timeout=10,
    )

    assert logout.status_code == 303 and logout.headers["location"] == "/console/login"
    replayed = console_page(gateway, copied)
    assert replayed.status_code == 303 and replayed.headers["location"] == "/console/login"
    decision = await post_decision(gateway, pending["approvalId"], cookies, csrf, from_console(gateway))
    assert decision.status_code == 303 and decision.headers["location"] == "/console/login"
    assert approval_status(gateway, pending["approvalId"]) == "awaiting_approval"


async def test_a_logout_in_the_browser_ends_the_session_a_copy_of_its_cookie_opened(
    inproc_sqlite_gateway: Gateway, browser: Browser
) -> None:
    gateway = inproc_sqlite_gateway
    page = await logged_in(browser, gateway, gateway.token("bob", roles="approver"))
    (copied,) = [c for c in await page.context.cookies() if c.get("name") == "writ_session"]
    thief = await (await browser.new_context()).new_page()
    await thief.context.add_cookies([copied])
    await thief.goto(f"{gateway.url}/console/inbox")
    await expect(thief).to_have_url(f"{gateway.url}/console/inbox")

    await page.locator("form[action='/console/logout'] button").click()

    await expect(page).to_have_url(f"{gateway.url}/console/login")
    await thief.goto(f"{gateway.url}/console/inbox")
    await expect(thief).to_have_url(f"{gateway.url}/console/login")


def test_an_unknown_or_expired_session_id_goes_to_the_login_page(inproc_sqlite_gateway: Gateway) -> None:
    gateway = inproc_sqlite_gateway
    long_ago = datetime.now(UTC) - timedelta(days=1)
    with gateway.store() as store:
        store.open_console_session(
            "an-expired-session",
            ConsoleSession(PrincipalRecord("bob", "acme", roles=("approver",)), long_ago, long_ago + HOUR),
        )

    for cookie in ("an-expired-session", "never-opened", gateway.token("bob", roles="approver")):
        for path in ("/console", "/console/inbox", "/console/unresolved"):
            page = console_page(gateway, cookie, path)
            assert page.status_code == 303 and page.headers["location"] == "/console/login", (cookie, path)


def test_a_session_lasts_as_long_as_its_token_and_never_past_twelve_hours(
    inproc_sqlite_gateway: Gateway,
) -> None:
    gateway = inproc_sqlite_gateway
    found = {}
    for name, ttl_s in (("short", 600), ("long", 7 * 24 * 3600)):
        before = datetime.now(UTC)
        login = httpx2.post(
            f"{gateway.url}/console/login",
            data={"token": minted(gateway, f"{name}-lived", ttl_s=ttl_s)},
            headers=from_console(gateway),
            timeout=10,
        )
        assert login.status_code == 303, login.text
        with gateway.store() as store:
            session = store.console_session(login.cookies["writ_session"], now=before)
        assert session is not None and session.principal.subject == f"{name}-lived"
        found[name] = (session.expires_at - before).total_seconds()

    assert 598 <= found["short"] <= 601  # the token's `exp`, whole seconds
    assert 12 * 3600 - 5 <= found["long"] <= 12 * 3600 + 1


def test_logging_in_again_ends_the_browsers_earlier_session(inproc_sqlite_gateway: Gateway) -> None:
    gateway = inproc_sqlite_gateway
    first = httpx2.post(
        f"{gateway.url}/console/login",
        data={"token": gateway.token("bob", roles="approver")},
        headers=from_console(gateway),
        timeout=10,
    ).cookies["writ_session"]

    again = httpx2.post(
        f"{gateway.url}/console/login",
        data={"token": gateway.token("bob", roles="approver")},
        headers={"Cookie": f"writ_session={first}", **from_console(gateway)},
        timeout=10,
    )

    assert again.status_code == 303 and again.cookies["writ_session"] != first
    assert console_page(gateway, first).status_code == 303
    assert console_page(gateway, again.cookies["writ_session"]).status_code == 200


def test_a_token_past_its_expiry_but_within_the_leeway_opens_no_session(
    inproc_sqlite_gateway: Gateway,
) -> None:
    # The verifier takes a token up to 30 s past its `exp` (clock skew); a session ending before it
    # begins is none, so the login says the token has expired.
    gateway = inproc_sqlite_gateway
    lapsed = minted(gateway, "lapsed", ttl_s=60, now=time.time() - 70)

    login = httpx2.post(
        f"{gateway.url}/console/login", data={"token": lapsed}, headers=from_console(gateway), timeout=10
    )

    assert login.status_code == 401 and "That token has expired" in login.text
    assert "writ_session" not in login.headers.get("set-cookie", "")
