"""Runs that Writ owns, and run controls, through the official MCP client, the API and the CLI, on both
stores (the real app in-process, `inproc.py`).

A 2025-11-25 client that names no run is grouped by its MCP session; a 2026-07-28 client, which has no
session, is in no run. A person with the approver or admin role stops a run (`POST
/api/runs/{id}/stop`, `writ runs stop`): its next call is refused `run_stopped` and told to stop and
report, its waiting approval is withdrawn; resumed, it takes calls again. Each refusal of the controls
themselves is said with its code.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest

from tests.gateway.mcp.inproc import Writ, acme, writ
from tests.postgres import fresh_schema

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def gateway(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Writ]:
    workdir = tmp_path_factory.mktemp("writ")
    with contextlib.ExitStack() as stack:
        if request.param == "sqlite":
            url = f"sqlite:///{workdir / 'writ.db'}"
        else:
            url = stack.enter_context(fresh_schema(request.getfixturevalue("postgres_url")))
        backend = stack.enter_context(acme(workdir))
        yield stack.enter_context(writ(workdir, backend, url))


def _agent() -> str:
    return f"agent-{uuid.uuid4().hex[:8]}"


def _refund(amount: int) -> dict[str, Any]:
    return {"order_id": "1002", "amount": amount, "currency": "EUR", "reason": "damaged in transit"}


def _post(gateway: Writ, path: str, token: str, body: Any) -> httpx2.Response:
    headers = {"Authorization": f"Bearer {token}"}
    return httpx2.post(f"{gateway.url}{path}", json=body, headers=headers, timeout=10)


def _approver(gateway: Writ, tenant: str = "acme") -> str:
    return gateway.token(f"approver-{uuid.uuid4().hex[:6]}", roles="approver", tenant=tenant)


async def test_a_session_is_one_run_and_a_stateless_client_is_in_none(gateway: Writ) -> None:
    token = gateway.token(_agent())
    async with gateway.client(token, mode="legacy") as client:
        first = await client.call_tool("refund_order", _refund(11))
        second = await client.call_tool("refund_order", _refund(12))
    async with gateway.client(token, mode="legacy") as client:
        other_session = await client.call_tool("refund_order", _refund(13))
    async with gateway.client(token) as client:
        stateless = await client.call_tool("refund_order", _refund(14))

    run_id = first.meta["writ/runId"]  # type: ignore[index]
    assert second.meta["writ/runId"] == run_id  # type: ignore[index]
    assert other_session.meta["writ/runId"] not in (None, run_id)  # type: ignore[index]
    assert stateless.meta is not None and "writ/runId" not in stateless.meta
    call = gateway.runtime.store.get_call(stateless.meta["writ/toolCallId"])
    assert call is not None and (call.status, call.run_id) == ("completed", None)
    run = gateway.runtime.store.get_run(run_id)
    assert run is not None and (run.origin, run.call_count, run.status) == ("session", 2, "active")


async def test_a_stopped_run_refuses_its_next_call_withdraws_its_approval_and_resumes(gateway: Writ) -> None:
    store = gateway.runtime.store
    async with gateway.client(gateway.token(_agent()), mode="legacy") as client:
        done = await client.call_tool("refund_order", _refund(15))
        waiting = await client.call_tool("refund_order", _refund(250))
        run_id = done.meta["writ/runId"]  # type: ignore[index]
        pending_id = (waiting.structured_content or {})["toolCallId"]
        assert (waiting.structured_content or {})["status"] == "approval_pending"

        stopped = _post(gateway, f"/api/runs/{run_id}/stop", _approver(gateway), {"reason": "runaway agent"})
        refused = await client.call_tool("refund_order", _refund(16))
        body = refused.structured_content or {}

        resumed = _post(gateway, f"/api/runs/{run_id}/resume", _approver(gateway), {"reason": "looked fine"})
        again = await client.call_tool("refund_order", _refund(17))

    assert stopped.status_code == 200, stopped.text
    assert (stopped.json()["status"], stopped.json()["stopReason"]) == ("stopped", "runaway agent")
    assert refused.is_error is False
    assert (body["status"], body["reason"]) == ("denied", "run_stopped")
    assert "Report to your user" in body["next"]
    withdrawn = store.get_call(pending_id)
    assert withdrawn is not None and withdrawn.status == "rejected"
    assert gateway.event_types(pending_id)[-1] == "approval.rejected"
    assert resumed.status_code == 200 and resumed.json()["status"] == "active"
    assert (again.structured_content or {}).get("status") != "denied"
    again_call = store.get_call(again.meta["writ/toolCallId"])  # type: ignore[index]
    assert again_call is not None and again_call.status == "completed"
    types = [e.type for e in store.events(run_id=run_id) if e.type.startswith("run.")]
    assert types == ["run.started", "run.stopped", "run.resumed"]
    assert store.verify().ok


async def test_each_refusal_of_a_run_control_says_why(gateway: Writ) -> None:
    async with gateway.client(gateway.token(_agent()), mode="legacy") as client:
        done = await client.call_tool("refund_order", _refund(18))
    run_id = done.meta["writ/runId"]  # type: ignore[index]
    path = f"/api/runs/{run_id}/stop"

    agent = _post(gateway, path, gateway.token(_agent()), {"reason": "x"})
    other_tenant = _post(gateway, path, _approver(gateway, tenant="globex"), {"reason": "x"})
    no_reason = _post(gateway, path, _approver(gateway), {})
    blank = _post(gateway, path, _approver(gateway), {"reason": "   "})
    unknown = _post(gateway, "/api/runs/run_nope/stop", _approver(gateway), {"reason": "x"})
    not_stopped = _post(gateway, f"/api/runs/{run_id}/resume", _approver(gateway), {"reason": "x"})
    first = _post(gateway, path, _approver(gateway), {"reason": "x"})
    twice = _post(gateway, path, _approver(gateway), {"reason": "x"})
    unauthenticated = httpx2.post(f"{gateway.url}{path}", json={"reason": "x"}, timeout=10)

    def said(response: httpx2.Response) -> tuple[int, str]:
        return response.status_code, response.json()["error"]

    assert said(agent) == (403, "insufficient_role")
    assert said(other_tenant) == (404, "not_found")
    assert said(no_reason) == (400, "invalid_request")
    assert said(blank) == (400, "invalid_request")
    assert said(unknown) == (404, "not_found")
    assert said(not_stopped) == (409, "run_not_stopped")
    assert first.status_code == 200
    assert said(twice) == (409, "run_already_stopped")
    assert said(unauthenticated) == (401, "invalid_token")
    stops = [e for e in gateway.runtime.store.events(run_id=run_id) if e.type == "run.stopped"]
    assert len(stops) == 1


async def test_the_api_lists_and_shows_runs_with_their_calls_and_budget_use(gateway: Writ) -> None:
    subject = _agent()
    async with gateway.client(gateway.token(subject), mode="legacy") as client:
        done = await client.call_tool("refund_order", _refund(19))
    run_id = done.meta["writ/runId"]  # type: ignore[index]
    headers = {"Authorization": f"Bearer {_approver(gateway)}"}

    listed = httpx2.get(f"{gateway.url}/api/runs", headers=headers, timeout=10).json()["runs"]
    shown = httpx2.get(f"{gateway.url}/api/runs/{run_id}", headers=headers, timeout=10).json()
    own = httpx2.get(
        f"{gateway.url}/api/runs/{run_id}",
        headers={"Authorization": f"Bearer {gateway.token(subject)}"},
        timeout=10,
    )
    stranger = httpx2.get(
        f"{gateway.url}/api/runs/{run_id}",
        headers={"Authorization": f"Bearer {gateway.token(_agent())}"},
        timeout=10,
    )

    assert run_id in [r["runId"] for r in listed]
    assert (shown["subject"], shown["status"], shown["callCount"]) == (subject, "active", 1)
    assert [c["toolCallId"] for c in shown["calls"]] == [done.meta["writ/toolCallId"]]  # type: ignore[index]
    assert own.status_code == 200
    assert stranger.status_code == 404


async def test_the_cli_stops_and_resumes_with_a_token_or_break_glass(gateway: Writ) -> None:
    async with gateway.client(gateway.token(_agent()), mode="legacy") as client:
        done = await client.call_tool("refund_order", _refund(20))
        run_id = done.meta["writ/runId"]  # type: ignore[index]
        waiting = await client.call_tool("refund_order", _refund(260))
        assert (waiting.structured_content or {})["status"] == "approval_pending"

        stopped = gateway.cli(
            "runs", "stop", run_id, "--reason", "from the shell", "--token", _approver(gateway)
        )
        refused = await client.call_tool("refund_order", _refund(21))
        no_authority = gateway.cli("runs", "resume", run_id, "--reason", "x", check=False)
        agent = gateway.cli(
            "runs", "resume", run_id, "--reason", "x", "--token", gateway.token(_agent()), check=False
        )
        resumed = gateway.cli("runs", "resume", run_id, "--break-glass", "--reason", "on call")
        listed = gateway.cli("runs", "list", "--tenant", "acme")
        shown = gateway.cli("runs", "show", run_id)

    assert json.loads(stopped.stdout)["status"] == "stopped"
    assert (refused.structured_content or {})["reason"] == "run_stopped"
    withdrawn = gateway.runtime.store.get_call((waiting.structured_content or {})["toolCallId"])
    assert withdrawn is not None and withdrawn.status == "rejected"
    assert no_authority.returncode == 2 and "--break-glass" in no_authority.stderr
    assert agent.returncode == 1 and "insufficient_role" in agent.stderr
    assert json.loads(resumed.stdout)["breakGlass"] is True
    assert run_id in listed.stdout
    assert json.loads(shown.stdout)["runId"] == run_id
    events = [
        e for e in gateway.runtime.store.events(run_id=run_id) if e.type in ("run.stopped", "run.resumed")
    ]
    assert [e.payload["break_glass"] for e in events] == [False, True]
    assert events[1].payload["resumed_by"].startswith("operator:")
