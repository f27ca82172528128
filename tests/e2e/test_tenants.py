"""Tenants are isolated on every read and control path: a principal of one tenant never sees, joins,
conflicts with or decides another tenant's calls, runs, events or approvals, whatever its roles.

Against the whole gateway served in this process, one per store for the module (`inproc_gateway`).
"""

from __future__ import annotations

from typing import Any

import httpx2
import pytest

from tests.e2e.harness import Backend, Gateway

pytestmark = pytest.mark.anyio


# One gateway and backend per store for the module (conftest): the cases use keys and amounts of their
# own, and count refunds against what the backend held before them.
@pytest.fixture
def gateway(inproc_gateway: Gateway) -> Gateway:
    return inproc_gateway


@pytest.fixture
def backend(inproc_backend: Backend) -> Backend:
    return inproc_backend


# Order 1002 (5000 EUR) can take every case's refunds; 1001 (120 EUR) would run out.
def refund(amount: float, order: str = "1002") -> dict[str, Any]:
    return {"order_id": order, "amount": amount, "currency": "EUR", "reason": "damaged in transit"}


def api(gateway: Gateway, path: str, token: str) -> httpx2.Response:
    return httpx2.get(f"{gateway.url}{path}", headers={"Authorization": f"Bearer {token}"}, timeout=10)


async def test_the_same_idempotency_key_in_two_tenants_is_two_effects_not_a_join_or_a_conflict(
    gateway: Gateway, backend: Backend
) -> None:
    before = len(backend.refunds())
    async with gateway.client(gateway.token("alice", tenant="acme")) as client:
        acme = await client.call_tool("refund_order", refund(20), meta={"writ/idempotencyKey": "shared"})
    async with gateway.client(gateway.token("alice", tenant="globex")) as client:
        same = await client.call_tool("refund_order", refund(20), meta={"writ/idempotencyKey": "shared"})
        other = await client.call_tool("refund_order", refund(30), meta={"writ/idempotencyKey": "k2"})
    async with gateway.client(gateway.token("bob", tenant="initech")) as client:
        different = await client.call_tool("refund_order", refund(30), meta={"writ/idempotencyKey": "k2"})
    assert {r.meta["writ/status"] for r in (acme, same, other, different)} == {"completed"}
    assert acme.meta["writ/toolCallId"] != same.meta["writ/toolCallId"]
    assert len(backend.refunds()) == before + 4


async def test_identical_calls_without_a_key_in_two_tenants_do_not_join(
    gateway: Gateway, backend: Backend
) -> None:
    ids, before = [], len(backend.refunds())
    for tenant in ("acme", "globex"):
        async with gateway.client(gateway.token("alice", tenant=tenant)) as client:
            ids.append((await client.call_tool("refund_order", refund(25))).meta["writ/toolCallId"])
    assert ids[0] != ids[1] and len(backend.refunds()) == before + 2


async def test_no_read_path_shows_a_call_run_or_approval_to_another_tenant(gateway: Gateway) -> None:
    async with gateway.client(gateway.token("alice", tenant="acme")) as client:
        pending = await client.call_tool("refund_order", refund(250), meta={"writ/runId": "tenants"})
    call_id = pending.structured_content["toolCallId"]
    approval_id = pending.structured_content["approvalId"]
    run_id = pending.meta["writ/runId"] if pending.meta else None
    own_admin = gateway.token("root", roles="admin,approver,auditor", tenant="acme")
    if run_id is None:
        run_id = api(gateway, f"/api/calls/{call_id}", own_admin).json()["runId"]

    paths = [
        f"/api/calls/{call_id}",
        f"/api/runs/{run_id}/events",
        f"/api/approvals/{approval_id}",
    ]
    for path in paths:
        assert api(gateway, path, own_admin).status_code == 200, path
    assert [a["approval_id"] for a in api(gateway, "/api/approvals", own_admin).json()["approvals"]] == [
        approval_id
    ]

    foreign_admin = gateway.token("root", roles="admin,approver,auditor", tenant="globex")
    for path in paths:
        response = api(gateway, path, foreign_admin)
        assert response.status_code == 404, path
        assert call_id not in response.text and "alice" not in response.text
    assert api(gateway, "/api/approvals", foreign_admin).json()["approvals"] == []
    decided = httpx2.post(
        f"{gateway.url}/api/approvals/{approval_id}/decision",
        json={"decision": "approve", "reason": "not mine to approve"},
        headers={"Authorization": f"Bearer {foreign_admin}"},
        timeout=10,
    )
    assert decided.status_code == 404
    assert api(gateway, f"/api/approvals/{approval_id}", own_admin).json()["status"] == "awaiting_approval"

    async with gateway.client(gateway.token("alice", roles="agent,admin", tenant="globex")) as client:
        status = await client.call_tool("writ_call_status", {"toolCallId": call_id})
    assert status.structured_content == {"status": "not_found", "toolCallId": call_id}
