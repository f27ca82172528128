"""The console's runs page in a real browser (hence e2e), against the whole gateway served in this
process, on both stores: an approver sees a run's calls and budget use, stops it (the agent's next call
is refused `run_stopped`, its waiting approval withdrawn) and resumes it; an agent may not."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Browser, expect

from tests.e2e.test_console import logged_in
from tests.gateway.mcp import inproc
from tests.postgres import fresh_schema

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

BUDGET = {"id": "refunds-a-day", "tools": ["refund_order"], "scope": "principal", "window": "1d", "limit": 50}


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
        yield stack.enter_context(inproc.writ(workdir, backend, url, budgets=[BUDGET]))


def _refund(amount: int) -> dict[str, Any]:
    return {"order_id": "1002", "amount": amount, "currency": "EUR", "reason": "damaged in transit"}


async def test_an_approver_stops_a_run_in_the_console_and_resumes_it(
    gateway: inproc.Writ, browser: Browser
) -> None:
    agent = f"agent-{uuid.uuid4().hex[:8]}"
    async with gateway.client(gateway.token(agent), mode="legacy") as client:
        done = await client.call_tool("refund_order", _refund(12))
        waiting = await client.call_tool("refund_order", _refund(300))
        run_id = done.meta["writ/runId"]  # type: ignore[index]
        pending_id = (waiting.structured_content or {})["toolCallId"]

        page = await logged_in(browser, gateway, gateway.token("bob", roles="approver"))
        await page.click("text=Runs")
        row = page.locator(f"#runs tr[data-run-id='{run_id}']")
        await expect(row).to_contain_text(agent)
        await expect(row).to_contain_text("session")
        await row.locator("a").click()
        await expect(page).to_have_url(f"{gateway.url}/console/runs/{run_id}")
        await expect(page.locator("#run-status")).to_have_text("active")
        await expect(page.locator("#calls tr[data-tool-call-id]")).to_have_count(2)
        await expect(page.locator(f"#calls tr[data-tool-call-id='{pending_id}']")).to_have_attribute(
            "data-status", "approval_pending"
        )
        await expect(page.locator("#budgets tr[data-budget='refunds-a-day']")).to_contain_text("2 calls")

        await page.fill("input[name=reason]", "agent is looping on refunds")
        await page.click("#stop")
        await expect(page).to_have_url(f"{gateway.url}/console/runs/{run_id}")
        await expect(page.locator("#run-status")).to_have_text("stopped")
        await expect(page.locator("#stopped-by")).to_contain_text("by bob")
        await expect(page.locator("#stopped-by")).to_contain_text("agent is looping on refunds")
        await expect(page.locator(f"#calls tr[data-tool-call-id='{pending_id}']")).to_have_attribute(
            "data-status", "rejected"
        )
        refused = await client.call_tool("refund_order", _refund(13))
        assert (refused.structured_content or {})["reason"] == "run_stopped"

        await page.fill("input[name=reason]", "talked to the owner")
        await page.click("#resume")
        await expect(page.locator("#run-status")).to_have_text("active")
        again = await client.call_tool("refund_order", _refund(14))
        assert (again.structured_content or {}).get("status") != "denied"

    events = [
        e for e in gateway.runtime.store.events(run_id=run_id) if e.type in ("run.stopped", "run.resumed")
    ]
    assert [(e.type, e.producer) for e in events] == [
        ("run.stopped", "writ-console"),
        ("run.resumed", "writ-console"),
    ]
    assert events[0].payload["stopped_by"] == "bob"


async def test_an_agent_may_not_see_or_stop_runs_and_a_stop_without_the_csrf_token_is_refused(
    gateway: inproc.Writ, browser: Browser
) -> None:
    agent = f"agent-{uuid.uuid4().hex[:8]}"
    async with gateway.client(gateway.token(agent), mode="legacy") as client:
        done = await client.call_tool("refund_order", _refund(15))
    run_id = done.meta["writ/runId"]  # type: ignore[index]

    page = await logged_in(browser, gateway, gateway.token("eve", roles="agent"))
    listing = await page.goto(f"{gateway.url}/console/runs")
    assert listing is not None and listing.status == 403
    forged = await page.request.post(f"{gateway.url}/console/runs/{run_id}/stop", form={"reason": "x"})
    assert forged.status in (403, 404)

    approver = await logged_in(browser, gateway, gateway.token("bob", roles="approver"))
    no_csrf = await approver.request.post(f"{gateway.url}/console/runs/{run_id}/stop", form={"reason": "x"})
    assert no_csrf.status == 403
    run = gateway.runtime.store.get_run(run_id)
    assert run is not None and run.status == "active"
