"""A revoked subject causes nothing more: later calls and approved-but-not-run calls are refused with
`principal_revoked`, recorded as events; revocation is an admin's act, per tenant, via API or CLI.

Against the whole gateway served in this process, one per store for the module (`inproc_gateway`, the
CLI run by its own `main`): a revocation outlives its case, so each case revokes subjects of its own.
"""

from __future__ import annotations

import json
from typing import Any

import httpx2
import pytest

from tests.e2e.harness import Backend, Gateway
from tests.e2e.test_approvals import fresh, request_refund

pytestmark = pytest.mark.anyio


def refund(amount: float) -> dict[str, object]:
    return {"order_id": "1001", "amount": amount, "currency": "EUR", "reason": "damaged in transit"}


def post(gateway: Gateway, path: str, token: str, body: dict) -> httpx2.Response:
    return httpx2.post(
        f"{gateway.url}{path}", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=10
    )


async def test_revoking_a_subject_refuses_its_later_calls_in_its_tenant_only(
    inproc_gateway: Gateway, inproc_backend: Backend
) -> None:
    gw, backend, name = inproc_gateway, inproc_backend, fresh("alice")
    alice = gw.token(name, tenant="acme")
    assert post(gw, f"/api/principals/{name}/revocation", gw.token("mallory"), {}).status_code == 403
    admin = gw.token("root", roles="admin", tenant="acme")
    revoked = post(gw, f"/api/principals/{name}/revocation", admin, {"reason": "left the company"})
    assert revoked.status_code == 200 and revoked.json()["revokedBy"] == "root"

    refunds = backend.refunds()
    async with gw.client(alice) as client:
        later = await client.call_tool("refund_order", refund(20))
    assert later.structured_content["status"] == "denied"
    assert later.structured_content["reason"] == "principal_revoked"
    assert backend.refunds() == refunds

    async with gw.client(gw.token(name, tenant="globex")) as client:
        elsewhere = await client.call_tool("refund_order", refund(20))
    assert elsewhere.meta["writ/status"] == "completed"
    [event] = standing_events(gw, name, "acme")
    assert (event["type"], event["payload"]["reason"]) == ("principal.revoked", "left the company")


async def test_writ_principals_revoke_stops_the_subjects_next_call(inproc_gateway: Gateway) -> None:
    gw, bob = inproc_gateway, fresh("bob")
    root = gw.token("root", roles="admin")
    out = gw.cli("principals", "revoke", bob, "--tenant", "acme", "--reason", "compromised", "--token", root)
    assert f"revoked {bob} in tenant acme" in out.stdout and "by root" in out.stdout
    async with gw.client(gw.token(bob, tenant="acme")) as client:
        result = await client.call_tool("lookup_order", {"order_id": "1001"})
    assert result.structured_content["reason"] == "principal_revoked"


async def test_writ_principals_revoke_needs_the_tenant_the_subject_acts_in(inproc_gateway: Gateway) -> None:
    gw, alice = inproc_gateway, fresh("alice")
    async with gw.client(gw.token(alice, tenant="acme")) as client:
        await client.call_tool("lookup_order", {"order_id": "1001"})
    glass = ("--break-glass", "--reason", "incident 7")
    untenanted = gw.cli("principals", "revoke", alice, *glass, check=False)
    assert untenanted.returncode == 2 and "--tenant" in untenanted.stderr
    wrong = gw.cli("principals", "revoke", alice, "--tenant", "default", *glass, check=False)
    assert wrong.returncode == 1
    assert f"{alice} was never seen in tenant default; seen in: acme" in wrong.stderr
    other = gw.cli(
        "principals", "revoke", alice, "--tenant", "acme", "--token", gw.token("root", "admin", "globex"),
        check=False,
    )  # fmt: skip
    assert other.returncode == 1 and "the token is for tenant globex" in other.stderr
    unroled = gw.cli(
        "principals", "revoke", alice, "--tenant", "acme", "--token", gw.token("eve"), check=False
    )
    assert unroled.returncode == 1 and "insufficient_role" in unroled.stderr
    assert not gateway_is_revoked(gw, alice)

    done = gw.cli("principals", "revoke", alice, "--tenant", "acme", *glass)
    assert f"revoked {alice} in tenant acme" in done.stdout and "(break-glass)" in done.stdout
    async with gw.client(gw.token(alice, tenant="acme")) as client:
        assert (await client.list_tools()).tools == []
    gw.cli("principals", "restore", alice, "--tenant", "acme", *glass)
    async with gw.client(gw.token(alice, tenant="acme")) as client:
        assert (await client.list_tools()).tools != []
    twice = gw.cli("principals", "restore", alice, "--tenant", "acme", *glass, check=False)
    assert twice.returncode == 1 and f"{alice} is not revoked in tenant acme" in twice.stderr
    standing = [(e["type"], e["payload"]["break_glass"], e["producer"]) for e in standing_events(gw, alice)]
    assert standing == [("principal.revoked", True, "writ-cli"), ("principal.restored", True, "writ-cli")]


async def test_a_revoked_admin_cannot_revoke_or_restore_at_the_cli(inproc_gateway: Gateway) -> None:
    gw, name = inproc_gateway, fresh("mallory")
    mallory = gw.token(name, roles="admin")
    gw.cli("principals", "revoke", name, "--tenant", "acme", "--token", gw.token("root", "admin"))
    for act in ("revoke", "restore"):
        refused = gw.cli("principals", act, name, "--tenant", "acme", "--token", mallory, check=False)
        assert refused.returncode == 1 and "principal_revoked" in refused.stderr
    assert gateway_is_revoked(gw, name)


def call(gateway: Gateway, method: str, path: str, token: str, body: dict | None = None) -> httpx2.Response:
    return httpx2.request(
        method,
        f"{gateway.url}{path}",
        json=body,
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )


async def test_a_revoked_approver_can_neither_read_nor_decide_nor_resolve_over_the_api(
    inproc_gateway: Gateway, inproc_backend: Backend
) -> None:
    gateway, backend, name = inproc_gateway, inproc_backend, fresh("bob")
    refunds = backend.refunds()
    pending = await request_refund(gateway, "revoked-approver")
    bob = gateway.token(name, roles="approver,admin")
    approval, tool_call = pending["approvalId"], pending["toolCallId"]
    assert call(gateway, "GET", f"/api/approvals/{approval}", bob).status_code == 200
    root = gateway.token("root", roles="admin")
    assert call(gateway, "POST", f"/api/principals/{name}/revocation", root, {}).status_code == 200

    attempts = [
        ("GET", "/api/approvals", None),
        ("GET", f"/api/approvals/{approval}", None),
        ("POST", f"/api/approvals/{approval}/decision", {"decision": "reject", "reason": "spite"}),
        ("GET", f"/api/calls/{tool_call}", None),
        ("POST", f"/api/calls/{tool_call}/resolution", {"outcome": "failed", "evidence": "trust me"}),
        ("GET", "/api/runs/any-run/events", None),
        ("POST", "/api/principals/root/revocation", {}),
        ("DELETE", f"/api/principals/{name}/revocation", {}),
    ]
    for method, path, body in attempts:
        refused = call(gateway, method, path, bob, body)
        assert (refused.status_code, refused.json()["error"]) == (403, "principal_revoked"), path
        assert f"{name} is revoked in tenant acme" in refused.json()["error_description"]
    assert not gateway_is_revoked(gateway, "root")
    still = call(gateway, "GET", f"/api/calls/{tool_call}", root).json()
    assert still["status"] == "approval_pending"
    assert backend.refunds() == refunds


def standing_events(gateway: Gateway, subject: str, tenant: str = "acme") -> list[dict[str, Any]]:
    """The log's standing events (`principal.*`) for `subject` in `tenant`, in order."""
    standing = [json.loads(line) for line in gateway.exported().splitlines() if '"principal.' in line]
    return [e for e in standing if e["payload"]["subject"] == subject and e["tenant"] == tenant]


def gateway_is_revoked(gateway: Gateway, subject: str) -> bool:
    """Whether the log's last standing event for `subject` in acme is a revocation."""
    mine = [e["type"] for e in standing_events(gateway, subject)]
    return bool(mine) and mine[-1] == "principal.revoked"


async def test_an_admin_restores_a_revoked_subject_over_the_api_and_its_powers_come_back(
    inproc_gateway: Gateway, inproc_backend: Backend
) -> None:
    gateway, backend, name = inproc_gateway, inproc_backend, fresh("alice")
    root = gateway.token("root", roles="admin")
    alice = gateway.token(name)
    revoked = call(gateway, "POST", f"/api/principals/{name}/revocation", root, {"reason": "lost laptop"})
    assert revoked.is_success
    agent = gateway.token("mallory", roles="agent,approver")
    refused = call(gateway, "DELETE", f"/api/principals/{name}/revocation", agent, {})
    assert (refused.status_code, refused.json()["error"]) == (403, "insufficient_role")
    async with gateway.client(alice) as client:
        assert (await client.list_tools()).tools == []
        status = await client.call_tool("writ_call_status", {"toolCallId": "tc-anything"})
        assert status.is_error and status.structured_content["reason"] == "principal_revoked"

    restored = call(gateway, "DELETE", f"/api/principals/{name}/revocation", root, {"reason": "laptop found"})
    assert restored.status_code == 200, restored.text
    assert (restored.json()["restoredBy"], restored.json()["lifted"]["reason"]) == ("root", "lost laptop")
    again = call(gateway, "DELETE", f"/api/principals/{name}/revocation", root, {})
    assert (again.status_code, again.json()["error"]) == (404, "not_revoked")
    refunds = backend.refunds()
    async with gateway.client(alice) as client:
        assert "refund_order" in {t.name for t in (await client.list_tools()).tools}
        done = await client.call_tool("refund_order", refund(20))
    assert done.meta["writ/status"] == "completed" and len(backend.refunds()) == len(refunds) + 1
    restored_events = [e for e in standing_events(gateway, name) if e["type"] == "principal.restored"]
    assert [(e["payload"]["restored_by"], e["payload"]["reason"]) for e in restored_events] == [
        ("root", "laptop found")
    ]
    assert "rebuilt projections" in gateway.cli("store", "rebuild").stdout
    async with gateway.client(alice) as client:
        assert (await client.list_tools()).tools != []
