"""Escalated calls settled by a person in the web console: a real browser (hence e2e) against the whole
gateway and backend served in this process, one of each per case (`inproc.writ`: the case counts what is
unresolved, so it shares no gateway)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from string import Template
from typing import Any

import pytest
import yaml
from playwright.async_api import Browser, expect

from store.keys import scoped_key
from tests.e2e.harness import REPO, Backend, Gateway
from tests.e2e.test_console import logged_in
from tests.eventually import eventually
from tests.gateway.mcp import inproc

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

ARGS = {"order_id": "1002", "amount": 15, "currency": "EUR", "reason": "late delivery"}


def capabilities_with_a_lookup_that_never_tells() -> list[dict[str, Any]]:
    """The demo's capabilities, the refund's lookup answered 405 by the backend: always inconclusive."""
    text = Template((REPO / "demo" / "demo.yaml").read_text())
    config = yaml.safe_load(text.safe_substitute(gateway_port=0, backend_port=0, state_dir="."))
    for capability in config["capabilities"]:
        if capability["id"] == "refund-order":
            capability["reconcile"] = {
                "method": "DELETE",
                "path": "/refunds?idempotency_key={idempotency_key}",
            }
    return config["capabilities"]


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[Backend]:
    with inproc.acme(tmp_path) as b:
        yield b


@pytest.fixture
def escalating_gateway(tmp_path: Path, backend: Backend) -> Iterator[Gateway]:
    overrides = {
        "workers": {"interval_s": 0.2, "reconcile_max_attempts": 1},
        "capabilities": capabilities_with_a_lookup_that_never_tells(),
    }
    with inproc.writ(tmp_path, backend, f"sqlite:///{tmp_path / 'writ.db'}", overrides=overrides) as g:
        yield g


async def escalated_call(gateway: Gateway, backend: Backend, key: str) -> str:
    """A refund whose answer the backend dropped after committing, escalated by the reconciler."""
    backend.chaos(drop_responses=1)
    async with gateway.client(gateway.token("alice")) as client:
        first = await client.call_tool("refund_order", ARGS, meta={"writ/idempotencyKey": key})
        assert first.structured_content["status"] == "result_unknown"
        tool_call_id = first.meta["writ/toolCallId"]
        await eventually(
            lambda: client.call_tool("writ_call_status", {"toolCallId": tool_call_id}),
            lambda s: s.structured_content["verification"] == "inconclusive",
        )
        return tool_call_id


async def test_an_approver_sees_an_escalated_call_with_its_evidence_and_resolves_it_as_succeeded(
    escalating_gateway: Gateway, backend: Backend, browser: Browser
) -> None:
    gateway = escalating_gateway
    tool_call_id = await escalated_call(gateway, backend, "console-unknown-1")
    page = await logged_in(browser, gateway, gateway.token("bob", roles="approver"))

    await page.click("text=Unresolved")
    await expect(page).to_have_url(f"{gateway.url}/console/unresolved")
    card = page.locator(f"article#call-{tool_call_id}")
    await expect(card.locator("h2")).to_contain_text("refund 15 EUR to order 1002")
    await expect(card.locator(".badge")).to_have_text("escalated: needs a person")
    # The key to look the refund up by at the backend: alice's, as Writ sent it.
    await expect(card).to_contain_text(scoped_key("acme", "alice", "console-unknown-1"))
    await expect(card.locator(".evidence")).to_contain_text("error=connection_lost")
    await expect(card.locator(".attempts li strong")).to_have_text(["started", "escalated"])
    await expect(card.locator(".attempts li[data-type=escalated]")).to_contain_text(
        "reason=inconclusive_after_retries"
    )
    await expect(card.locator(".attempts li[data-type=escalated]")).to_contain_text("status_code=405")

    await card.locator("input[value=succeeded]").check()
    await card.locator("textarea[name=evidence]").fill("refund for key console-unknown-1 is in the ledger")
    await card.locator("button[type=submit]").click()

    await expect(page).to_have_url(f"{gateway.url}/console/calls/{tool_call_id}")
    await expect(page.locator("#call-status")).to_have_text("completed")
    resolved = page.locator("#timeline li[data-type='reconciliation.resolved']")
    await expect(resolved).to_contain_text("resolved_by=bob")
    await expect(resolved).to_contain_text("verdict=confirmed_success")
    await page.goto(f"{gateway.url}/console/unresolved")
    await expect(page.locator(".empty").first).to_have_text("Nothing is unresolved.")
    with gateway.store() as store:
        last = store.events(tool_call_id=tool_call_id)[-1]
    assert (last.producer, last.payload["resolved_by"]) == ("writ-console", "bob")
    assert last.payload["evidence"] == {"manual": "refund for key console-unknown-1 is in the ledger"}
    assert len(backend.refunds("console-unknown-1")) == 1


async def test_agents_may_not_resolve_and_a_form_without_the_csrf_token_is_refused(
    escalating_gateway: Gateway, backend: Backend, browser: Browser
) -> None:
    gateway = escalating_gateway
    tool_call_id = await escalated_call(gateway, backend, "console-unknown-2")
    agent = await logged_in(browser, gateway, gateway.token("alice"))
    approver = await logged_in(browser, gateway, gateway.token("bob", roles="approver"))

    await agent.goto(f"{gateway.url}/console/unresolved")
    await expect(agent.locator("main")).to_contain_text("needs the approver or admin role")
    agent_csrf = await agent.locator("input[name=csrf]").first.get_attribute("value")
    assert agent_csrf
    by_agent = await agent.request.post(
        f"{gateway.url}/console/calls/{tool_call_id}/resolution",
        form={"outcome": "failed", "evidence": "nothing happened", "csrf": agent_csrf},
    )
    forged = await approver.request.post(
        f"{gateway.url}/console/calls/{tool_call_id}/resolution",
        form={"outcome": "failed", "evidence": "nothing happened", "csrf": "guessed"},
    )

    assert (by_agent.status, forged.status) == (403, 403)
    assert "needs the approver or admin role" in await by_agent.text()
    assert "stale" in await forged.text()
    await approver.goto(f"{gateway.url}/console/unresolved")
    await expect(approver.locator(f"article#call-{tool_call_id} .badge")).to_have_text(
        "escalated: needs a person"
    )
