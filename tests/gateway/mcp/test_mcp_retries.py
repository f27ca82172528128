"""`writ calls retry` and `POST /api/calls/{id}/retry`: a person re-runs a failed call as a new call,
through the official MCP client's calls, the API and the CLI, on both stores (the real app in-process).

The failure is real: acme-payments answers 404 for a refund of an order it does not have, which Writ
records `failed`. Its retry is sent once more, under a new key unless the capability declares its
backend deduplicates on the key; a completed call is refused, and so is a person whose standing is
revoked or who lacks the role. The log stays one `writ audit verify` passes.
"""

from __future__ import annotations

import contextlib
import copy
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from string import Template
from typing import Any

import httpx2
import pytest
import yaml

from tests.eventually import eventually
from tests.gateway.mcp.inproc import Writ, acme, writ
from tests.postgres import fresh_schema

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[3]


def _capabilities() -> list[dict[str, Any]]:
    """The demo's capabilities and a refund whose backend is declared to deduplicate on the key."""
    text = Template((REPO / "demo" / "demo.yaml").read_text())
    demo = yaml.safe_load(text.safe_substitute(gateway_port=0, backend_port=0, state_dir="."))
    capabilities: list[dict[str, Any]] = demo["capabilities"]
    [refund] = [c for c in capabilities if c["tool"] == "refund_order"]
    deduped = copy.deepcopy(refund) | {
        "id": "refund-deduped",
        "tool": "refund_deduped",
        "dedupes_on_key": True,
    }
    return [*capabilities, deduped]


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def gateway(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Writ]:
    workdir = tmp_path_factory.mktemp("writ")
    with contextlib.ExitStack() as stack:
        if request.param == "sqlite":
            url = f"sqlite:///{workdir / 'writ.db'}"
        else:
            url = stack.enter_context(fresh_schema(request.getfixturevalue("postgres_url")))
        backend = stack.enter_context(acme(workdir))
        rule = {
            "id": "agents-refund-deduped",
            "tools": ["refund_deduped"],
            "roles": ["agent"],
            "decision": "allow",
        }
        config = {"overrides": {"capabilities": _capabilities()}, "extra_rules": [rule]}
        yield stack.enter_context(writ(workdir, backend, url, **config))


def _agent(gateway: Writ) -> str:
    return gateway.token(f"agent-{uuid.uuid4().hex[:8]}")


def _approver(gateway: Writ, name: str | None = None) -> str:
    return gateway.token(name or f"approver-{uuid.uuid4().hex[:6]}", roles="approver")


def _refund(order: str, amount: int = 5) -> dict[str, Any]:
    return {"order_id": order, "amount": amount, "currency": "EUR", "reason": "damaged in transit"}


def _post(gateway: Writ, path: str, token: str, body: Any) -> httpx2.Response:
    headers = {"Authorization": f"Bearer {token}"}
    return httpx2.post(f"{gateway.url}{path}", json=body, headers=headers, timeout=30)


def _get(gateway: Writ, path: str, token: str) -> dict[str, Any]:
    response = httpx2.get(f"{gateway.url}{path}", headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def _failed_call(gateway: Writ, tool: str = "refund_order") -> str:
    async with gateway.client(_agent(gateway)) as client:
        result = await client.call_tool(tool, _refund("9999"))
    assert result.meta is not None
    tool_call_id: str = result.meta["writ/toolCallId"]
    call = gateway.runtime.store.get_call(tool_call_id)
    assert call is not None and call.status == "failed"
    return tool_call_id


def _types(gateway: Writ, tool_call_id: str) -> list[str]:
    return [e.type for e in gateway.runtime.store.events(tool_call_id=tool_call_id)]


def _verified(gateway: Writ) -> None:
    out = gateway.cli("audit", "verify", check=False)
    assert out.returncode == 0, out.stdout + out.stderr


async def test_a_failed_call_retried_once_is_dispatched_once_more_under_a_new_key(gateway: Writ) -> None:
    original = await _failed_call(gateway)
    approver = _approver(gateway)

    response = _post(gateway, f"/api/calls/{original}/retry", approver, {"reason": "order re-keyed"})

    assert response.status_code == 200, response.text
    retry = response.json()
    assert retry["retryOf"] == original and retry["toolCallId"] != original
    assert retry["status"] == "failed"  # the backend still has no order 9999: sent, and refused again
    was = _get(gateway, f"/api/calls/{original}", approver)
    assert retry["idempotencyKey"] == f"{was['idempotencyKey']}:retry-1"
    assert _types(gateway, original).count("tool_call.dispatching") == 1
    assert _types(gateway, retry["toolCallId"]).count("tool_call.dispatching") == 1
    assert "tool_call.retry_requested" in _types(gateway, original)
    assert (was["retriedAs"], was["retryReason"]) == (retry["toolCallId"], "order re-keyed")
    assert was["status"] == "failed"
    now = _get(gateway, f"/api/calls/{retry['toolCallId']}", approver)
    assert (now["retryOf"], now["retryNumber"]) == (original, 1)
    again = _post(gateway, f"/api/calls/{original}/retry", approver, {"reason": "once more"})
    assert (again.status_code, again.json()["error"]) == (409, "already_retried")
    _verified(gateway)


async def test_a_backend_that_deduplicates_gets_the_failed_calls_own_key(gateway: Writ) -> None:
    original = await _failed_call(gateway, "refund_deduped")
    approver = _approver(gateway)

    response = _post(gateway, f"/api/calls/{original}/retry", approver, {"reason": "backend was down"})

    assert response.status_code == 200, response.text
    was = _get(gateway, f"/api/calls/{original}", approver)
    assert response.json()["idempotencyKey"] == was["idempotencyKey"] == was["retryKey"]
    holder = gateway.runtime.store.find_call_by_key("acme", was["subject"], was["idempotencyKey"])
    assert holder is not None and holder.tool_call_id == response.json()["toolCallId"]
    _verified(gateway)


async def test_a_completed_call_is_refused_and_nothing_is_recorded(gateway: Writ) -> None:
    async with gateway.client(_agent(gateway)) as client:
        done = await client.call_tool("refund_order", _refund("1002", 1))
    assert done.meta is not None
    tool_call_id = done.meta["writ/toolCallId"]
    before = len(gateway.runtime.store.events())

    response = _post(gateway, f"/api/calls/{tool_call_id}/retry", _approver(gateway), {"reason": "again"})

    assert response.status_code == 409
    assert response.json()["error"] == "retry_not_failed"
    assert "completed" in response.json()["error_description"]
    assert len(gateway.runtime.store.events()) == before


async def test_a_retry_by_a_revoked_approver_or_an_agent_is_refused(gateway: Writ) -> None:
    original = await _failed_call(gateway)
    name = f"approver-{uuid.uuid4().hex[:6]}"
    approver = _approver(gateway, name)
    admin = gateway.token("root", roles="admin")
    assert _post(gateway, f"/api/principals/{name}/revocation", admin, {"reason": "left"}).status_code == 200

    revoked = _post(gateway, f"/api/calls/{original}/retry", approver, {"reason": "again"})
    agent = _post(gateway, f"/api/calls/{original}/retry", _agent(gateway), {"reason": "again"})
    by_cli = gateway.cli("calls", "retry", original, "--reason", "again", "--token", approver, check=False)

    assert (revoked.status_code, revoked.json()["error"]) == (403, "principal_revoked")
    assert (agent.status_code, agent.json()["error"]) == (403, "insufficient_role")
    assert by_cli.returncode != 0 and "revoked" in by_cli.stderr
    assert "tool_call.retry_requested" not in _types(gateway, original)


async def test_writ_calls_retry_records_who_and_calls_show_shows_the_link(gateway: Writ) -> None:
    original = await _failed_call(gateway)
    name = f"approver-{uuid.uuid4().hex[:6]}"

    out = gateway.cli("calls", "retry", original, "--reason", "fixed", "--token", _approver(gateway, name))
    glass = gateway.cli("calls", "retry", original, "--break-glass", "--reason", "x", check=False)

    retry = json.loads(out.stdout)
    assert retry["retryOf"] == original and retry["breakGlass"] is False
    shown = json.loads(gateway.cli("calls", "show", original).stdout)
    assert (shown["retriedAs"], shown["retriedBy"]) == (retry["toolCallId"], name)
    assert json.loads(gateway.cli("calls", "show", retry["toolCallId"]).stdout)["retryOf"] == original
    assert glass.returncode != 0 and "already_retried" in glass.stderr + glass.stdout
    _verified(gateway)


async def test_a_retry_is_authorized_now_and_waits_for_an_approver_when_the_policy_asks(
    gateway: Writ,
) -> None:
    async with gateway.client(_agent(gateway)) as client:
        waiting = await client.call_tool("refund_order", _refund("9999", 300))
    pending = waiting.structured_content or {}
    assert pending["status"] == "approval_pending"
    approver = _approver(gateway)
    decided = _post(
        gateway, f"/api/approvals/{pending['approvalId']}/decision", approver, {"decision": "approve"}
    )
    assert decided.status_code == 200, decided.text
    store = gateway.runtime.store
    original = pending["toolCallId"]
    await eventually(lambda: store.get_call(original), lambda c: c is not None and c.status == "failed")

    response = _post(gateway, f"/api/calls/{original}/retry", approver, {"reason": "order fixed"})

    assert response.status_code == 200, response.text
    retry = response.json()
    assert (retry["status"], retry["retryOf"]) == ("approval_pending", original)
    assert retry["approvalId"] != pending["approvalId"]
    assert "tool_call.dispatching" not in _types(gateway, retry["toolCallId"])


async def test_a_break_glass_retry_is_recorded_as_the_operator_never_as_a_person(gateway: Writ) -> None:
    original = await _failed_call(gateway)

    out = gateway.cli("calls", "retry", original, "--break-glass", "--reason", "incident 12")

    assert json.loads(out.stdout)["breakGlass"] is True
    [asked] = [
        e for e in gateway.runtime.store.events(tool_call_id=original) if e.type.endswith("retry_requested")
    ]
    assert asked.payload["break_glass"] is True
    assert asked.payload["requested_by"].startswith("operator:")
    assert asked.payload["reason"] == "incident 12"
