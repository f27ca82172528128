"""Budgets through an MCP client: principal budgets apply whatever run the client names, or none.

In-process (`inproc.py`): issue 13's bypasses were six calls with no `runId`, and six with a fresh
`runId` each, all let through by a rule counting calls in the run.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.eventually import eventually
from tests.gateway.mcp.inproc import Backend, Writ, acme, writ

pytestmark = pytest.mark.anyio

BUDGET = {
    "id": "three-refunds-an-hour",
    "tools": ["refund_order"],
    "scope": "principal",
    "window": "1h",
    "limit": 3,
}


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    with acme(tmp_path_factory.mktemp("acme")) as b:
        yield b


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, backend: Backend) -> Iterator[Writ]:
    workdir: Path = tmp_path_factory.mktemp("writ")
    with writ(workdir, backend, f"sqlite:///{workdir / 'writ.db'}", budgets=[BUDGET]) as g:
        yield g


def _refund(n: int) -> dict[str, Any]:
    return {"order_id": "1002", "amount": 10 + n, "currency": "EUR", "reason": "damaged in transit"}


async def _six_refunds(gateway: Writ, run_ids: list[str | None]) -> list[tuple[str, dict[str, Any]]]:
    """Each call's recorded status and what the client was told."""
    subject = f"looping-agent-{uuid.uuid4().hex[:8]}"
    heard = []
    async with gateway.client(gateway.token(subject)) as client:
        for n, run_id in enumerate(run_ids):
            meta = {"writ/runId": run_id} if run_id else None
            result = await client.call_tool("refund_order", _refund(n), meta=meta)
            assert result.is_error is False
            call = gateway.runtime.store.get_call(result.meta["writ/toolCallId"])  # type: ignore[index]
            assert call is not None
            heard.append((call.status, result.structured_content or {}))
    return heard


def _assert_three_then_refused(gateway: Writ, heard: list[tuple[str, dict[str, Any]]]) -> None:
    assert [status for status, _ in heard] == ["completed"] * 3 + ["denied"] * 3
    for _, body in heard[3:]:
        assert body["status"] == "denied"
        assert body["reason"] == "budget_exceeded"
        budget = body["budget"]
        assert (budget["id"], budget["limit"], budget["used"]) == ("three-refunds-an-hour", 3, 3)
        resets = datetime.fromisoformat(budget["resetsAt"])
        assert resets.minute == resets.second == 0
        assert "do not retry before then" in body["next"]
        types = gateway.event_types(body["toolCallId"])
        assert types[-3:] == ["tool_call.requested", "budget.exceeded", "tool_call.denied"]


async def test_a_principal_budget_stops_calls_that_name_no_run(gateway: Writ) -> None:
    _assert_three_then_refused(gateway, await _six_refunds(gateway, [None] * 6))


async def test_a_principal_budget_stops_calls_that_name_a_fresh_run_each_time(gateway: Writ) -> None:
    runs: list[str | None] = [f"run-{uuid.uuid4().hex[:8]}" for _ in range(6)]
    _assert_three_then_refused(gateway, await _six_refunds(gateway, runs))


async def test_an_approved_call_runs_on_the_charge_it_took_when_admitted_and_counts_once(
    gateway: Writ,
) -> None:
    store = gateway.runtime.store
    subject = f"approving-agent-{uuid.uuid4().hex[:8]}"
    async with gateway.client(gateway.token(subject)) as client:
        for n in range(2):
            assert (await client.call_tool("refund_order", _refund(n))).meta["writ/status"] == "completed"  # type: ignore[index]
        pending = (await client.call_tool("refund_order", _refund(250))).structured_content or {}
        assert pending["status"] == "approval_pending"
        decided = httpx2.post(
            f"{gateway.url}/api/approvals/{pending['approvalId']}/decision",
            json={"decision": "approve", "reason": "checked"},
            headers={"Authorization": f"Bearer {gateway.token('bob', roles='approver')}"},
            timeout=10,
        )
        assert decided.status_code == 200, decided.text
        settled = await eventually(
            lambda: store.get_call(pending["toolCallId"]),
            lambda call: call is not None and call.status not in ("approved", "dispatching"),
        )
        fourth = (await client.call_tool("refund_order", _refund(4))).structured_content or {}

    assert settled is not None and settled.status == "completed"
    events = {e.type: e for e in store.events(tool_call_id=pending["toolCallId"])}
    hours = {events[t].occurred_at[:13] for t in ("tool_call.requested", "tool_call.dispatching")}
    if len(hours) == 1:  # admitted and run in one window of the hourly budget (all but at an hour's turn)
        assert events["tool_call.dispatching"].payload["charges"] is None  # charged when admitted only
        assert (fourth["reason"], fourth["budget"]["used"]) == ("budget_exceeded", 3)
    else:  # the window turned while it waited: it is charged in the new one too
        assert events["tool_call.dispatching"].payload["charges"] is not None


async def test_a_budget_holds_across_a_restart_of_the_gateway(tmp_path: Path, backend: Backend) -> None:
    url = f"sqlite:///{tmp_path / 'writ.db'}"
    subject = f"restarted-agent-{uuid.uuid4().hex[:8]}"
    heard: list[tuple[str, dict[str, Any]]] = []
    for amounts in ([1, 2], [3, 4, 5, 6]):  # a gateway, then another on the same store
        with writ(tmp_path, backend, url, budgets=[BUDGET]) as g:
            async with g.client(g.token(subject)) as client:
                for amount in amounts:
                    result = await client.call_tool("refund_order", _refund(amount))
                    call = g.runtime.store.get_call(result.meta["writ/toolCallId"])  # type: ignore[index]
                    assert call is not None
                    heard.append((call.status, result.structured_content or {}))
            if len(heard) == 6:
                _assert_three_then_refused(g, heard)


ASKING = {
    "id": "two-refunds-then-ask",
    "tools": ["refund_order"],
    "window": "1d",
    "limit": 2,
    "on_exceed": "require_approval",
    "approval": {"approver_role": "approver", "expires_in": "1h"},
}


async def test_a_budget_saying_require_approval_sends_the_next_call_to_a_person(
    tmp_path: Path, backend: Backend
) -> None:
    with writ(tmp_path, backend, f"sqlite:///{tmp_path / 'writ.db'}", budgets=[ASKING]) as g:
        store = g.runtime.store
        async with g.client(g.token(f"asking-agent-{uuid.uuid4().hex[:8]}")) as client:
            first = [await client.call_tool("refund_order", _refund(n)) for n in range(2)]
            third = (await client.call_tool("refund_order", _refund(2))).structured_content or {}
            decided = httpx2.post(
                f"{g.url}/api/approvals/{third['approvalId']}/decision",
                json={"decision": "approve", "reason": "one more is fine"},
                headers={"Authorization": f"Bearer {g.token('bob', roles='approver')}"},
                timeout=10,
            )
            settled = await eventually(
                lambda: store.get_call(third["toolCallId"]),
                lambda call: call is not None and call.status not in ("approved", "dispatching"),
            )

    assert [(r.meta or {}).get("writ/status") for r in first] == ["completed", "completed"]
    assert third["status"] == "approval_pending"
    # Writ's own sentence for the approver ("budget ... is used up") is recorded, not passed off to the
    # client as a policy rule's message.
    assert "message" not in third
    assert decided.status_code == 200, decided.text
    assert settled is not None and settled.status == "completed"
    types = g.event_types(third["toolCallId"])
    assert types[:3] == ["tool_call.requested", "budget.exceeded", "approval.required"]
    assert "tool_call.completed" in types
