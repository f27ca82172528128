"""Unknown outcomes from the demo backend's /_chaos faults, settled by reconciliation (DESIGN §3.3)."""

from __future__ import annotations

from pathlib import Path

import httpx2
import pytest

from store import Store
from tests.e2e.harness import Backend, Gateway, writ_gateway
from tests.eventually import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

ARGS = {"order_id": "1002", "amount": 15, "currency": "EUR", "reason": "late delivery"}


async def settled_status(client, tool_call_id: str) -> dict:
    status = await eventually(
        lambda: client.call_tool("writ_call_status", {"toolCallId": tool_call_id}),
        lambda s: s.structured_content["status"] != "result_unknown",
    )
    return status.structured_content


@pytest.mark.parametrize("fault", ["drop_responses", "fail_after_commit"])
async def test_a_refund_whose_answer_was_lost_becomes_unknown_then_reconciles_to_completed(
    gateway: Gateway, backend: Backend, fault: str
) -> None:
    backend.chaos(**{fault: 1})
    async with gateway.client(gateway.token("alice")) as client:
        first = await client.call_tool("refund_order", ARGS, meta={"writ/idempotencyKey": f"lost-{fault}"})
        assert first.structured_content["status"] == "result_unknown"
        assert first.structured_content["reconciliation"] == "pending"

        settled = await settled_status(client, first.meta["writ/toolCallId"])

    assert (settled["status"], settled["verification"]) == ("completed", "confirmed_success")
    assert settled["result"]["structuredContent"]["idempotency_key"] == f"lost-{fault}"
    assert len(backend.refunds(f"lost-{fault}")) == 1
    events = gateway.cli("calls", "show", first.meta["writ/toolCallId"]).stdout
    assert "reconciliation.started" in events and "reconciliation.resolved" in events


async def test_a_refund_the_backend_never_executed_reconciles_to_failed(
    sqlite_gateway: Gateway, backend: Backend
) -> None:
    backend.chaos(hang=1)
    async with sqlite_gateway.client(sqlite_gateway.token("alice")) as client:
        first = await client.call_tool("refund_order", ARGS, meta={"writ/idempotencyKey": "hung"})
        assert first.structured_content["status"] == "result_unknown"

        settled = await settled_status(client, first.meta["writ/toolCallId"])

    assert (settled["status"], settled["verification"]) == ("failed", "confirmed_failure")
    assert backend.refunds("hung") == []


async def test_an_approver_resolves_an_unknown_call_over_the_api_and_an_agent_may_not(
    tmp_path: Path, backend: Backend
) -> None:
    # No workers: the unknown call stays unknown until a person settles it.
    overrides = {"workers": {"enabled": False}}
    with writ_gateway(tmp_path, backend, f"sqlite:///{tmp_path / 'writ.db'}", overrides=overrides) as gateway:
        backend.chaos(hang=1)
        async with gateway.client(gateway.token("alice")) as client:
            first = await client.call_tool("refund_order", ARGS, meta={"writ/idempotencyKey": "by-hand"})
        tool_call_id = first.meta["writ/toolCallId"]
        url = f"{gateway.url}/api/calls/{tool_call_id}/resolution"
        body = {"outcome": "failed", "evidence": "no refund in the bank statement"}
        agent = {"Authorization": f"Bearer {gateway.token('alice')}"}
        approver = {"Authorization": f"Bearer {gateway.token('bob', roles='approver')}"}
        outsider = {"Authorization": f"Bearer {gateway.token('eve', roles='approver', tenant='other')}"}

        assert httpx2.post(url, json=body, headers=agent, timeout=10).status_code == 403
        assert httpx2.post(url, json=body, headers=outsider, timeout=10).status_code == 404
        answer = httpx2.post(url, json=body, headers=approver, timeout=10)
        again = httpx2.post(url, json=body, headers=approver, timeout=10)

    assert answer.status_code == 200, answer.text
    assert (answer.json()["status"], answer.json()["verification"]) == ("failed", "confirmed_failure")
    assert answer.json()["resolvedBy"] == "bob"
    assert again.status_code == 409
    with Store.open(f"sqlite:///{tmp_path / 'writ.db'}") as store:
        assert store.events(tool_call_id=tool_call_id)[-1].payload["resolved_by"] == "bob"
