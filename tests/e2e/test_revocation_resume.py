"""A call approved after its requester was revoked is refused by the resume worker, not dispatched
(against the whole gateway, its resume worker included, served in this process: `inproc_sqlite_gateway`)."""

from __future__ import annotations

import httpx2
import pytest

from tests.e2e.harness import Backend, Gateway
from tests.e2e.test_approvals import fresh
from tests.e2e.test_revocation import post, refund
from tests.eventually import eventually

pytestmark = pytest.mark.anyio


async def test_an_approved_call_of_a_revoked_subject_is_refused_with_a_reason(
    inproc_sqlite_gateway: Gateway, inproc_sqlite_backend: Backend
) -> None:
    gw, backend, alice = inproc_sqlite_gateway, inproc_sqlite_backend, fresh("alice")
    refunds = backend.refunds()
    async with gw.client(gw.token(alice, tenant="acme")) as client:
        pending = await client.call_tool("refund_order", refund(250))
    assert pending.structured_content["status"] == "approval_pending"
    admin = gw.token("root", roles="admin", tenant="acme")
    assert post(gw, f"/api/principals/{alice}/revocation", admin, {"reason": "left"}).status_code == 200
    approver = gw.token("carol", roles="approver", tenant="acme")
    approval_id = pending.structured_content["approvalId"]
    assert (
        post(gw, f"/api/approvals/{approval_id}/decision", approver, {"decision": "approve"}).status_code
        == 200
    )
    call_url = f"/api/calls/{pending.structured_content['toolCallId']}"
    call = await eventually(
        lambda: httpx2.get(gw.url + call_url, headers={"Authorization": f"Bearer {admin}"}).json(),
        lambda call: call["status"] in ("denied", "completed"),
    )
    assert call["status"] == "denied" and call["reason"] == "principal_revoked"
    assert backend.refunds() == refunds
