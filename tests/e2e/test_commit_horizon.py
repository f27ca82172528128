"""A backend slower than the timeout, one slower than the commit horizon, one that never executes, and a
contradicted verdict (issue 11), against the real acme-payments process and the real gateway.

The first two cases share one backend and gateway per store (each with keys and counts of its own);
the lease margin, which the horizon adds to, is `QUICK_LEASE_MARGIN_S` rather than the default 10 s: the
same rule, waited for less long.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx2
import pytest
from playwright.async_api import Browser, expect

from gateway.config import load_config
from gateway.mcp.results import CONTRADICTED, FAILED_BY
from store import Store
from tests.e2e.harness import QUICK_LEASE_MARGIN_S, Backend, Gateway, writ_gateway
from tests.e2e.test_console import logged_in
from tests.eventually import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

# The timeout is 1 s, the backend commits 2 s after it got the request, the horizon is 4 s.
TIMEOUT_S = 1.0
HORIZON_S = 4.0
COMMIT_DELAY_MS = 2000
ARGS = {"order_id": "1002", "amount": 20, "currency": "EUR", "reason": "damaged"}
HELD_PAST_DEADLINE_MS = int((HORIZON_S + QUICK_LEASE_MARGIN_S + 1.5) * 1000)
"""Longer than a refund may take to commit: the deadline Writ sends is the horizon after the latest
send, at most the lease margin after the dispatch record."""
WORKERS = {"interval_s": 0.2, "reconcile_backoff_s": 0.5, "lease_margin_s": QUICK_LEASE_MARGIN_S}


@pytest.fixture(scope="module")
def slow_gateway(
    tmp_path_factory: pytest.TempPathFactory, module_backend: Backend, module_store_url: str
) -> Iterator[Gateway]:
    with writ_gateway(
        tmp_path_factory.mktemp("writ"),
        module_backend,
        module_store_url,
        timeout_s=TIMEOUT_S,
        commit_horizon_s=HORIZON_S,
        overrides={"workers": WORKERS},
    ) as g:
        yield g


@pytest.fixture
def slow_backend(module_backend: Backend) -> Iterator[Backend]:
    """The module's backend, its faults cleared after the case."""
    yield module_backend
    module_backend.chaos()


def refunds_of_order(backend: Backend, order_id: str) -> list[dict[str, Any]]:
    return [r for r in backend.refunds() if r["order_id"] == order_id]


async def status_until(client: Any, tool_call_id: str, done: Any, limit_s: float = 30) -> dict[str, Any]:
    status = await eventually(
        lambda: client.call_tool("writ_call_status", {"toolCallId": tool_call_id}),
        lambda s: done(s.structured_content),
        within_s=limit_s,
    )
    return status.structured_content


def store_of(gateway: Gateway) -> Store:
    import yaml

    return Store.open(yaml.safe_load(gateway.config.read_text())["store"]["url"])


async def test_a_refund_committed_after_the_timeout_completes_once_and_identical_resends_join_it(
    slow_gateway: Gateway, slow_backend: Backend
) -> None:
    gateway, backend = slow_gateway, slow_backend
    refunded = len(refunds_of_order(backend, "1002"))
    with store_of(gateway) as store:
        recorded = {c.tool_call_id for c in store.list_calls()}
    backend.chaos(commit_delay_ms=COMMIT_DELAY_MS)
    async with gateway.client(gateway.token("alice")) as client:
        first = await client.call_tool("refund_order", ARGS)  # no key: Writ derives one
        assert first.structured_content["status"] == "result_unknown", first.structured_content
        tool_call_id = first.meta["writ/toolCallId"]
        # The model re-sends the identical call while the outcome is unknown: it joins, never dispatches.
        before = await client.call_tool("refund_order", ARGS)
        assert before.meta["writ/toolCallId"] == tool_call_id
        assert before.structured_content["status"] == "result_unknown", before.structured_content

        settled = await status_until(client, tool_call_id, lambda s: s["status"] != "result_unknown")
        after = await client.call_tool("refund_order", ARGS)

    assert (settled["status"], settled["verification"]) == ("completed", "confirmed_success")
    assert after.meta["writ/toolCallId"] == tool_call_id and after.is_error is False
    assert len(refunds_of_order(backend, "1002")) == refunded + 1
    with store_of(gateway) as store:
        events = store.events(tool_call_id=tool_call_id)
        calls = [c.tool_call_id for c in store.list_calls()]
        assert [c for c in calls if c not in recorded] == [tool_call_id]
    assert "tool_call.failed" not in [e.type for e in events]
    assert all(e.payload.get("verdict") != "confirmed_failure" for e in events)
    assert sum(e.type == "tool_call.dispatching" for e in events) == 1


async def test_a_refund_held_past_the_commit_deadline_never_lands_and_a_resend_after_failed_refunds_once(
    slow_gateway: Gateway, slow_backend: Backend
) -> None:
    gateway, backend = slow_gateway, slow_backend
    args = {**ARGS, "amount": 7, "reason": "held past its deadline"}
    backend.chaos(commit_delay_ms=HELD_PAST_DEADLINE_MS)
    async with gateway.client(gateway.token("alice")) as client:
        first = await client.call_tool("refund_order", args)  # no key, as a model's call
        backend.chaos()
        assert first.structured_content["status"] == "result_unknown", first.structured_content
        first_id = first.meta["writ/toolCallId"]
        settled = await status_until(client, first_id, lambda s: s["status"] != "result_unknown")
        with store_of(gateway) as store:
            first_call = store.get_call(first_id)
        assert first_call is not None
        key = first_call.idempotency_key
        # The backend still holds the first refund when the horizon ends; it is refused, not run.
        await eventually(backend.held, lambda held: key not in held, within_s=HELD_PAST_DEADLINE_MS / 1000)
        again = await client.call_tool("refund_order", args)

    assert (settled["status"], settled["verification"]) == ("failed", "confirmed_failure")
    assert settled["next"] == FAILED_BY["no_effect_after_horizon"]
    again_id = again.meta["writ/toolCallId"]
    assert again_id != first_id and again.is_error is False, again.content
    with store_of(gateway) as store:
        again_call = store.get_call(again_id)
        first_events = store.events(tool_call_id=first_id)
    assert again_call is not None and again_call.status == "completed"
    # One refund for the key, the re-send's: the verdict that the first one did nothing was true.
    assert [r["request_id"] for r in backend.refunds(key)] == [again_call.external_request_id]
    assert "reconciliation.resolved" in [e.type for e in first_events]
    # The first re-check of the verdict (a horizon after it) finds the re-send's refund under the key,
    # which names the re-send's request id: no record of the first call's, nothing contradicted.
    with store_of(gateway) as store:
        rechecked = await eventually(
            lambda: store.events(tool_call_id=first_id),
            lambda events: events[-1].type == "reconciliation.rechecked",
            within_s=HORIZON_S * 4,
        )
        first_call = store.get_call(first_id)
    evidence = rechecked[-1].payload["evidence"]
    assert (evidence["verdict"], evidence["records_of_others"]) == ("not_found", 1)
    assert first_call is not None and (first_call.status, first_call.verification_status) == (
        "failed",
        "confirmed_failure",
    )
    assert "reconciliation.contradicted" not in [e.type for e in rechecked]


async def test_a_refund_the_backend_never_executes_fails_only_after_the_horizon_with_the_times(
    slow_gateway: Gateway, slow_backend: Backend
) -> None:
    gateway, backend = slow_gateway, slow_backend
    backend.chaos(hang=1)
    async with gateway.client(gateway.token("alice")) as client:
        first = await client.call_tool("refund_order", ARGS, meta={"writ/idempotencyKey": "never"})
        assert first.structured_content["status"] == "result_unknown", first.structured_content
        assert "never answered" in first.structured_content["next"]
        tool_call_id = first.meta["writ/toolCallId"]
        settled = await status_until(client, tool_call_id, lambda s: s["status"] != "result_unknown")

    assert (settled["status"], settled["verification"]) == ("failed", "confirmed_failure")
    assert settled["next"] == FAILED_BY["no_effect_after_horizon"]
    assert backend.refunds("never") == []
    with store_of(gateway) as store:
        events = store.events(tool_call_id=tool_call_id)
    # Looked up before the horizon: nothing found, and that was not taken as a failure. (After the
    # verdict, its re-checks may have begun: those come later.)
    verdict = next(e for e in reversed(events) if e.type == "reconciliation.resolved")
    early = [e for e in events if e.type == "reconciliation.inconclusive" and e.seq < verdict.seq]
    assert early and all(e.payload["evidence"]["reason"] == "before_commit_horizon" for e in early)
    assert verdict.payload["verdict"] == "confirmed_failure"
    evidence = verdict.payload["evidence"]
    sent_at, horizon_at, looked_up_at = (
        datetime.fromisoformat(evidence[k]) for k in ("sent_at", "horizon_at", "looked_up_at")
    )
    # The horizon counts from the latest moment the request can have left: the dispatcher sends only
    # while its whole bounded dispatch fits its lease, at most the lease margin after `sent_at`.
    margin_s = load_config(gateway.config).workers.lease_margin_s
    assert (horizon_at - sent_at).total_seconds() == HORIZON_S + margin_s
    assert looked_up_at >= horizon_at
    assert datetime.fromisoformat(verdict.occurred_at) >= horizon_at


async def test_a_refund_the_backend_commits_past_its_deadline_is_found_by_a_recheck_and_contradicts_failed(
    slow_gateway: Gateway, slow_backend: Backend
) -> None:
    gateway, backend = slow_gateway, slow_backend
    args = {**ARGS, "amount": 9, "reason": "committed past its deadline"}
    # The backend holds the refund past the deadline Writ sent, and then commits it anyway.
    backend.chaos(commit_delay_ms=HELD_PAST_DEADLINE_MS, ignore_deadline=1)
    async with gateway.client(gateway.token("alice")) as client:
        first = await client.call_tool("refund_order", args)
        assert first.structured_content["status"] == "result_unknown", first.structured_content
        tool_call_id = first.meta["writ/toolCallId"]
        settled = await status_until(client, tool_call_id, lambda s: s["status"] != "result_unknown")
        assert (settled["status"], settled["verification"]) == ("failed", "confirmed_failure")
        # The refund lands after the verdict; a re-check (a horizon after it ended) finds it.
        told = await status_until(
            client, tool_call_id, lambda s: s.get("reconciliation") == "contradicted", limit_s=HORIZON_S * 6
        )

    assert (told["status"], told["next"]) == ("failed", CONTRADICTED)
    with store_of(gateway) as store:
        call = store.get_call(tool_call_id)
        event = store.events(tool_call_id=tool_call_id)[-1]
    assert call is not None
    assert [r["request_id"] for r in backend.refunds(call.idempotency_key)] == [call.external_request_id]
    assert (event.type, event.payload["source"], event.payload["settled_evidence"]["verdict"]) == (
        "reconciliation.contradicted",
        "lookup",
        "not_found",
    )
    assert event.payload["evidence"]["result"]["structuredContent"]["request_id"] == call.external_request_id


async def test_a_contradicted_verdict_is_escalated_and_shown_by_the_cli_the_api_and_the_console(
    tmp_path: Path, backend: Backend, browser: Browser
) -> None:
    store_url = f"sqlite:///{tmp_path / 'writ.db'}"
    with writ_gateway(
        tmp_path,
        backend,
        store_url,
        timeout_s=TIMEOUT_S,
        commit_horizon_s=HORIZON_S,
        overrides={"workers": WORKERS},
    ) as gateway:
        backend.chaos(hang=1)
        async with gateway.client(gateway.token("alice")) as client:
            first = await client.call_tool("refund_order", ARGS, meta={"writ/idempotencyKey": "disputed"})
            tool_call_id = first.meta["writ/toolCallId"]
            await status_until(client, tool_call_id, lambda s: s["status"] == "failed")
            # A person has evidence the refund happened after all: the verdict is contradicted.
            approver = {"Authorization": f"Bearer {gateway.token('bob', roles='approver')}"}
            answer = httpx2.post(
                f"{gateway.url}/api/calls/{tool_call_id}/resolution",
                json={"outcome": "succeeded", "evidence": "refund seen in the bank statement"},
                headers=approver,
                timeout=10,
            )
            told = await client.call_tool("writ_call_status", {"toolCallId": tool_call_id})

        assert answer.status_code == 200, answer.text
        api = httpx2.get(f"{gateway.url}/api/calls/{tool_call_id}", headers=approver, timeout=10).json()
        listed = gateway.cli("calls", "list", "--unresolved").stdout
        page = await logged_in(browser, gateway, gateway.token("bob", roles="approver"))
        await page.goto(f"{gateway.url}/console/unresolved")
        card = page.locator(f"article#call-{tool_call_id}")
        await expect(card.locator(".badge")).to_contain_text("contradicted")
        await expect(card.locator(".outcome")).to_have_text(CONTRADICTED)
        contradiction = card.locator(".attempts li[data-type=contradicted]")
        await expect(contradiction).to_contain_text("source=resolution")
        await expect(contradiction).to_contain_text("manual=refund seen in the bank statement")
        await expect(contradiction).to_contain_text("verdict=not_found")  # the verdict's own evidence
        await page.goto(f"{gateway.url}/console/calls/{tool_call_id}")
        await expect(page.locator("#call-outcome")).to_have_text(CONTRADICTED)

    assert (api["status"], api["verification"], api["reconciliation"]) == (
        "failed",
        "inconclusive",
        "contradicted",
    )
    assert (told.structured_content["reconciliation"], told.structured_content["next"]) == (
        "contradicted",
        CONTRADICTED,
    )
    assert tool_call_id in listed and "CONTRADICTED" in listed
    with Store.open(store_url) as store:
        event = store.events(tool_call_id=tool_call_id)[-1]
    assert (event.type, event.payload["by"], event.payload["settled_status"]) == (
        "reconciliation.contradicted",
        "bob",
        "failed",
    )
