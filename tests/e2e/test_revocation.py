"""A revoked subject causes nothing more: later calls and approved-but-not-run calls are refused with
`principal_revoked`, recorded as events; revocation is an admin's act, per tenant, via API or CLI."""

from __future__ import annotations

import json

import httpx2
import pytest

from tests.e2e.harness import Backend, Gateway
from tests.e2e.test_approvals import request_refund

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
    exported = gw.exported()
    assert '"type": "principal.revoked"' in exported and "left the company" in exported


async def test_writ_principals_revoke_stops_the_subjects_next_call(sqlite_gateway: Gateway) -> None:
    gw = sqlite_gateway
    root = gw.token("root", roles="admin")
    out = gw.cli(
        "principals", "revoke", "bob", "--tenant", "acme", "--reason", "compromised", "--token", root
    )
    assert "revoked bob in tenant acme" in out.stdout and "by root" in out.stdout
    async with gw.client(gw.token("bob", tenant="acme")) as client:
        result = await client.call_tool("lookup_order", {"order_id": "1001"})
    assert result.structured_content["reason"] == "principal_revoked"


async def test_writ_principals_revoke_needs_the_tenant_the_subject_acts_in(sqlite_gateway: Gateway) -> None:
    gw = sqlite_gateway
    async with gw.client(gw.token("alice", tenant="acme")) as client:
        await client.call_tool("lookup_order", {"order_id": "1001"})
    glass = ("--break-glass", "--reason", "incident 7")
    untenanted = gw.cli("principals", "revoke", "alice", *glass, check=False)
    assert untenanted.returncode == 2 and "--tenant" in untenanted.stderr
    wrong = gw.cli("principals", "revoke", "alice", "--tenant", "default", *glass, check=False)
    assert wrong.returncode == 1
    assert "alice was never seen in tenant default; seen in: acme" in wrong.stderr
    other = gw.cli(
        "principals", "revoke", "alice", "--tenant", "acme", "--token", gw.token("root", "admin", "globex"),
        check=False,
    )  # fmt: skip
    assert other.returncode == 1 and "the token is for tenant globex" in other.stderr
    unroled = gw.cli(
        "principals", "revoke", "alice", "--tenant", "acme", "--token", gw.token("eve"), check=False
    )
    assert unroled.returncode == 1 and "insufficient_role" in unroled.stderr
    assert not gateway_is_revoked(gw, "alice")

    done = gw.cli("principals", "revoke", "alice", "--tenant", "acme", *glass)
    assert "revoked alice in tenant acme" in done.stdout and "(break-glass)" in done.stdout
    async with gw.client(gw.token("alice", tenant="acme")) as client:
        assert (await client.list_tools()).tools == []
    gw.cli("principals", "restore", "alice", "--tenant", "acme", *glass)
    async with gw.client(gw.token("alice", tenant="acme")) as client:
        assert (await client.list_tools()).tools != []
    twice = gw.cli("principals", "restore", "alice", "--tenant", "acme", *glass, check=False)
    assert twice.returncode == 1 and "alice is not revoked in tenant acme" in twice.stderr
    standing = [
        (e["type"], e["payload"]["break_glass"], e["producer"])
        for e in map(json.loads, gw.exported().splitlines())
        if e["type"].startswith("principal.")
    ]
    assert standing == [("principal.revoked", True, "writ-cli"), ("principal.restored", True, "writ-cli")]


async def test_a_revoked_admin_cannot_revoke_or_restore_at_the_cli(sqlite_gateway: Gateway) -> None:
    gw = sqlite_gateway
    mallory = gw.token("mallory", roles="admin")
    gw.cli("principals", "revoke", "mallory", "--tenant", "acme", "--token", gw.token("root", "admin"))
    for act in ("revoke", "restore"):
        refused = gw.cli("principals", act, "mallory", "--tenant", "acme", "--token", mallory, check=False)
        assert refused.returncode == 1 and "principal_revoked" in refused.stderr
    assert gateway_is_revoked(gw, "mallory")


def call(gateway: Gateway, method: str, path: str, token: str, body: dict | None = None) -> httpx2.Response:
    return httpx2.request(
        method,
        f"{gateway.url}{path}",
        json=body,
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )


async def test_a_revoked_approver_can_neither_read_nor_decide_nor_resolve_over_the_api(
    gateway: Gateway, backend: Backend
) -> None:
    pending = await request_refund(gateway, "revoked-approver")
    bob = gateway.token("bob", roles="approver,admin")
    approval, tool_call = pending["approvalId"], pending["toolCallId"]
    assert call(gateway, "GET", f"/api/approvals/{approval}", bob).status_code == 200
    root = gateway.token("root", roles="admin")
    assert call(gateway, "POST", "/api/principals/bob/revocation", root, {}).status_code == 200

    attempts = [
        ("GET", "/api/approvals", None),
        ("GET", f"/api/approvals/{approval}", None),
        ("POST", f"/api/approvals/{approval}/decision", {"decision": "reject", "reason": "spite"}),
        ("GET", f"/api/calls/{tool_call}", None),
        ("POST", f"/api/calls/{tool_call}/resolution", {"outcome": "failed", "evidence": "trust me"}),
        ("GET", "/api/runs/any-run/events", None),
        ("POST", "/api/principals/root/revocation", {}),
        ("DELETE", "/api/principals/bob/revocation", {}),
    ]
    for method, path, body in attempts:
        refused = call(gateway, method, path, bob, body)
        assert (refused.status_code, refused.json()["error"]) == (403, "principal_revoked"), path
        assert "bob is revoked in tenant acme" in refused.json()["error_description"]
    assert not gateway_is_revoked(gateway, "root")
    still = call(gateway, "GET", f"/api/calls/{tool_call}", root).json()
    assert still["status"] == "approval_pending"
    assert backend.refunds() == []


def gateway_is_revoked(gateway: Gateway, subject: str) -> bool:
    """Whether the log's last standing event for `subject` in acme is a revocation."""
    standing = [json.loads(line) for line in gateway.exported().splitlines() if '"principal.' in line]
    mine = [e["type"] for e in standing if e["payload"]["subject"] == subject and e["tenant"] == "acme"]
    return bool(mine) and mine[-1] == "principal.revoked"


async def test_an_admin_restores_a_revoked_subject_over_the_api_and_its_powers_come_back(
    gateway: Gateway, backend: Backend
) -> None:
    root = gateway.token("root", roles="admin")
    alice = gateway.token("alice")
    revoked = call(gateway, "POST", "/api/principals/alice/revocation", root, {"reason": "lost laptop"})
    assert revoked.is_success
    agent = gateway.token("mallory", roles="agent,approver")
    refused = call(gateway, "DELETE", "/api/principals/alice/revocation", agent, {})
    assert (refused.status_code, refused.json()["error"]) == (403, "insufficient_role")
    async with gateway.client(alice) as client:
        assert (await client.list_tools()).tools == []
        status = await client.call_tool("writ_call_status", {"toolCallId": "tc-anything"})
        assert status.is_error and status.structured_content["reason"] == "principal_revoked"

    restored = call(gateway, "DELETE", "/api/principals/alice/revocation", root, {"reason": "laptop found"})
    assert restored.status_code == 200, restored.text
    assert (restored.json()["restoredBy"], restored.json()["lifted"]["reason"]) == ("root", "lost laptop")
    again = call(gateway, "DELETE", "/api/principals/alice/revocation", root, {})
    assert (again.status_code, again.json()["error"]) == (404, "not_revoked")
    async with gateway.client(alice) as client:
        assert "refund_order" in {t.name for t in (await client.list_tools()).tools}
        done = await client.call_tool("refund_order", refund(20))
    assert done.meta["writ/status"] == "completed" and len(backend.refunds()) == 1
    restored_events = [
        json.loads(line) for line in gateway.exported().splitlines() if '"principal.restored"' in line
    ]
    assert [(e["payload"]["restored_by"], e["payload"]["reason"]) for e in restored_events] == [
        ("root", "laptop found")
    ]
    assert "rebuilt projections" in gateway.cli("store", "rebuild").stdout
    async with gateway.client(alice) as client:
        assert (await client.list_tools()).tools != []
