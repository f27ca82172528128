"""The console and a principal's standing, and how a break-glass decision shows: real Chromium (hence
e2e) against the whole gateway served in this process (`inproc_sqlite_gateway`, the CLI run by its own
`main`)."""

from __future__ import annotations

import getpass
import socket

import httpx2
import pytest
from playwright.async_api import Browser, expect

from tests.e2e.harness import Backend, Gateway
from tests.e2e.test_approvals import fresh, request_refund
from tests.e2e.test_console import console_page, logged_in, signed_in

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


def revoke(gateway: Gateway, subject: str) -> None:
    revoked = httpx2.post(
        f"{gateway.url}/api/principals/{subject}/revocation",
        json={"reason": "left"},
        headers={"Authorization": f"Bearer {gateway.token('root', roles='admin')}"},
        timeout=10,
    )
    assert revoked.status_code == 200, revoked.text


async def test_a_session_opened_before_a_revocation_cannot_decide_and_cannot_log_in_again(
    inproc_sqlite_gateway: Gateway, inproc_sqlite_backend: Backend, browser: Browser
) -> None:
    gateway, backend, name = inproc_sqlite_gateway, inproc_sqlite_backend, fresh("bob")
    refunds = backend.refunds()
    pending = await request_refund(gateway, "console-revoked")
    bob = gateway.token(name, roles="approver")
    page = await logged_in(browser, gateway, bob)
    card = page.locator(f"article#{pending['approvalId']}")
    await expect(card.locator(".status")).to_have_text("awaiting_approval")

    revoke(gateway, name)
    await card.locator("input[name=reason]").fill("approving on my way out")
    await card.locator("button.approve").click()

    await expect(page).to_have_url(f"{gateway.url}/console/login")
    await page.goto(f"{gateway.url}/console/inbox")
    await expect(page).to_have_url(f"{gateway.url}/console/login")
    await page.fill("#token", bob)
    await page.click("#login")
    await expect(page.locator(".error")).to_contain_text(f"{name} is revoked in tenant acme")
    await page.goto(f"{gateway.url}/console/calls/{pending['toolCallId']}")
    await expect(page).to_have_url(f"{gateway.url}/console/login")
    carol = gateway.token("carol", roles="approver")
    approval = httpx2.get(
        f"{gateway.url}/api/approvals/{pending['approvalId']}",
        headers={"Authorization": f"Bearer {carol}"},
        timeout=10,
    ).json()
    assert (approval["status"], approval["decided_by"]) == ("awaiting_approval", None)
    assert backend.refunds() == refunds


async def test_a_revocation_ends_the_principals_console_sessions_and_a_restore_does_not_reopen_them(
    inproc_sqlite_gateway: Gateway,
) -> None:
    gateway, name = inproc_sqlite_gateway, fresh("bob")
    cookies, _ = await signed_in(gateway, gateway.token(name, roles="approver"))
    others, _ = await signed_in(gateway, gateway.token(fresh("carol"), roles="approver"))

    revoke(gateway, name)
    restored = httpx2.delete(
        f"{gateway.url}/api/principals/{name}/revocation",
        headers={"Authorization": f"Bearer {gateway.token('root', roles='admin')}"},
        timeout=10,
    )

    assert restored.status_code == 200, restored.text
    # Ended, not only refused while revoked: its standing is back, the old session is not.
    page = console_page(gateway, cookies["writ_session"])
    assert page.status_code == 303 and page.headers["location"] == "/console/login"
    assert console_page(gateway, others["writ_session"]).status_code == 200
    again, _ = await signed_in(gateway, gateway.token(name, roles="approver"))
    assert console_page(gateway, again["writ_session"]).status_code == 200


async def test_a_break_glass_decision_is_marked_in_the_inbox_and_the_timeline(
    inproc_sqlite_gateway: Gateway, browser: Browser
) -> None:
    gateway = inproc_sqlite_gateway
    glass = await request_refund(gateway, "console-glass")
    gateway.cli("approvals", "reject", glass["approvalId"], "--break-glass", "--reason", "idp down")
    tokened = await request_refund(gateway, "console-tokened")
    carol = gateway.token("carol", roles="approver")
    gateway.cli("approvals", "reject", tokened["approvalId"], "--token", carol, "--reason", "dup")
    operator = f"operator:{getpass.getuser()}@{socket.gethostname()}"

    page = await logged_in(browser, gateway, gateway.token("audra", roles="auditor"))
    decided = page.locator("li", has=page.locator(f"a[href='/console/calls/{glass['toolCallId']}']"))
    await expect(decided).to_contain_text(f"rejected by {operator}")
    await expect(decided.locator(".break-glass")).to_have_text("break-glass")
    by_token = page.locator("li", has=page.locator(f"a[href='/console/calls/{tokened['toolCallId']}']"))
    await expect(by_token).to_contain_text("rejected by carol")
    await expect(by_token.locator(".break-glass")).to_have_count(0)

    await page.goto(f"{gateway.url}/console/calls/{glass['toolCallId']}")
    rejected = page.locator("#timeline li[data-type='approval.rejected']")
    await expect(rejected).to_contain_text(f"decided_by={operator}")
    await expect(rejected.locator(".break-glass")).to_have_text("break-glass")
    await page.goto(f"{gateway.url}/console/approvals/{glass['approvalId']}")
    await expect(page.locator("article .status .break-glass")).to_have_text("break-glass")


async def test_an_approval_whose_call_was_refused_at_execution_says_so_beside_who_approved_it(
    inproc_sqlite_gateway: Gateway, inproc_sqlite_backend: Backend, browser: Browser
) -> None:
    gateway, backend, requester = inproc_sqlite_gateway, inproc_sqlite_backend, fresh("alice")
    refunds = backend.refunds()
    pending = await request_refund(gateway, fresh("console-then-denied"), who=requester)
    revoke(gateway, requester)  # after asking: the approval is granted, the call re-decided and refused
    page = await logged_in(browser, gateway, gateway.token("bob", roles="approver"))
    await page.locator(f"article#{pending['approvalId']} button.approve").click()
    await expect(page).to_have_url(f"{gateway.url}/console/calls/{pending['toolCallId']}")
    await expect(page.locator("#call-status")).to_have_text("denied")

    await page.goto(f"{gateway.url}/console/approvals/{pending['approvalId']}")
    status = page.locator(f"article#{pending['approvalId']} .status")
    await expect(status).to_contain_text("approved by bob")
    await expect(status.locator(".refused-after-approval")).to_have_text(
        "then denied at execution: principal_revoked"
    )
    await page.goto(f"{gateway.url}/console/inbox")
    await expect(
        page.locator(f"#decided li:has(a[href='/console/calls/{pending['toolCallId']}'])")
    ).to_contain_text("approved by bob, then denied at execution: principal_revoked")
    assert backend.refunds() == refunds
