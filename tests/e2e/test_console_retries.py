"""Retrying a failed call from its page in the console, in a real browser (hence e2e), against the whole
gateway served in this process, on both stores: an approver presses retry with a reason and lands on
the retry's page, which names the original; the original names its retry and offers no second retry;
an agent sees no button."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.async_api import Browser, expect

from tests.e2e.test_console import logged_in
from tests.gateway.mcp import inproc
from tests.postgres import fresh_schema

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def gateway(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[inproc.Writ]:
    workdir: Path = tmp_path_factory.mktemp("writ")
    with contextlib.ExitStack() as stack:
        if request.param == "sqlite":
            url = f"sqlite:///{workdir / 'writ.db'}"
        else:
            url = stack.enter_context(fresh_schema(request.getfixturevalue("postgres_url")))
        backend = stack.enter_context(inproc.acme(workdir))
        yield stack.enter_context(inproc.writ(workdir, backend, url))


async def test_an_approver_retries_a_failed_call_from_its_page(
    gateway: inproc.Writ, browser: Browser
) -> None:
    agent = gateway.token(f"agent-{uuid.uuid4().hex[:8]}")
    async with gateway.client(agent) as client:
        # acme-payments has no order 9999: it answers 404 and Writ records the call failed.
        result = await client.call_tool(
            "refund_order", {"order_id": "9999", "amount": 5, "currency": "EUR", "reason": "damaged"}
        )
    assert result.meta is not None
    original = result.meta["writ/toolCallId"]

    as_agent = await logged_in(browser, gateway, agent)  # the caller sees its call, not the button
    await as_agent.goto(f"{gateway.url}/console/calls/{original}")
    await expect(as_agent.locator("#call-status")).to_have_text("failed")
    await expect(as_agent.locator("#retry")).to_have_count(0)

    page = await logged_in(browser, gateway, gateway.token("bob", roles="approver"))
    await page.goto(f"{gateway.url}/console/calls/{original}")
    await expect(page.locator("#call-status")).to_have_text("failed")
    await page.fill("#retry-form input[name=reason]", "order number corrected upstream")
    await page.click("#retry")

    await expect(page.locator("#retry-of")).to_contain_text(original)
    retry = page.url.rsplit("/", 1)[1]
    assert retry != original
    await expect(page.locator("#call-status")).to_have_text("failed")  # sent once more, 404 again
    await expect(page.locator("#timeline li[data-type='tool_call.dispatching']")).to_have_count(1)
    await page.click("#retry-of a")
    await expect(page.locator("#retried-as")).to_contain_text(retry)
    await expect(page.locator("#retried-as")).to_contain_text("by bob")
    await expect(page.locator("#timeline li[data-type='tool_call.retry_requested']")).to_have_count(1)
    await expect(page.locator("#retry")).to_have_count(0)
