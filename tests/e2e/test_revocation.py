"""A revoked subject causes nothing more: later calls and approved-but-not-run calls are refused with
`principal_revoked`, recorded as events; revocation is an admin's act, per tenant, via API or CLI."""

from __future__ import annotations

import httpx2
import pytest

from tests.e2e.harness import Backend, Gateway

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


def refund(amount: float) -> dict[str, object]:
    return {"order_id": "1001", "amount": amount, "currency": "EUR", "reason": "damaged in transit"}


def post(gateway: Gateway, path: str, token: str, body: dict) -> httpx2.Response:
    return httpx2.post(
        f"{gateway.url}{path}", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=10
    )


async def test_revoking_a_subject_refuses_its_later_calls_in_its_tenant_only(
    sqlite_gateway: Gateway, backend: Backend
) -> None:
    gw = sqlite_gateway
    alice = gw.token("alice", tenant="acme")
    assert post(gw, "/api/principals/alice/revocation", gw.token("mallory"), {}).status_code == 403
    admin = gw.token("root", roles="admin", tenant="acme")
    revoked = post(gw, "/api/principals/alice/revocation", admin, {"reason": "left the company"})
    assert revoked.status_code == 200 and revoked.json()["revokedBy"] == "root"

    async with gw.client(alice) as client:
        later = await client.call_tool("refund_order", refund(20))
    assert later.structured_content["status"] == "denied"
    assert later.structured_content["reason"] == "principal_revoked"
    assert backend.refunds() == []

    async with gw.client(gw.token("alice", tenant="globex")) as client:
        elsewhere = await client.call_tool("refund_order", refund(20))
    assert elsewhere.meta["writ/status"] == "completed"
    exported = gw.cli("audit", "export").stdout
    assert '"type": "principal.revoked"' in exported and "left the company" in exported


async def test_writ_principals_revoke_stops_the_subjects_next_call(sqlite_gateway: Gateway) -> None:
    out = sqlite_gateway.cli("principals", "revoke", "bob", "--tenant", "acme", "--reason", "compromised")
    assert "revoked bob in tenant acme" in out.stdout
    async with sqlite_gateway.client(sqlite_gateway.token("bob", tenant="acme")) as client:
        result = await client.call_tool("lookup_order", {"order_id": "1001"})
    assert result.structured_content["reason"] == "principal_revoked"
