"""Approvals: decided over HTTP or the CLI and run once, against the whole gateway served in this process
(`inproc_gateway`, the CLI run by its own `main`); surviving kill -9 of every `writ` process (e2e: real
processes, since only they can be killed)."""

from __future__ import annotations

import getpass
import json
import signal
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.e2e.harness import Backend, Gateway, writ_gateway
from tests.eventually import eventually
from tests.gateway.mcp import inproc

pytestmark = pytest.mark.anyio


def fresh(name: str) -> str:
    """A subject no other case uses: the module's cases share a gateway, and a revocation outlives its
    case."""
    return f"{name}-{uuid.uuid4().hex[:8]}"


def refund_args(amount: float = 250, order: str = "1002") -> dict[str, object]:
    return {"order_id": order, "amount": amount, "currency": "EUR", "reason": "damaged in transit"}


async def request_refund(gateway: Gateway, key: str, who: str = "alice", roles: str = "agent") -> Any:
    async with gateway.client(gateway.token(who, roles=roles)) as client:
        result = await client.call_tool("refund_order", refund_args(), meta={"writ/idempotencyKey": key})
    assert result.structured_content["status"] == "approval_pending", result
    return result.structured_content


def decide(gateway: Gateway, approval_id: str, token: str, decision: str = "approve", **body: Any) -> Any:
    return httpx2.post(
        f"{gateway.url}/api/approvals/{approval_id}/decision",
        json={"decision": decision, **body},
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )


async def settled(
    gateway: Gateway, tool_call_id: str, token: str, *, timeout_s: float = 20
) -> dict[str, Any]:
    """The call's state once it is no longer approved or dispatching (bounded wait)."""
    return await eventually(
        lambda: httpx2.get(
            f"{gateway.url}/api/calls/{tool_call_id}",
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
        ).json(),
        lambda body: body["status"] not in ("approval_pending", "approved", "dispatching"),
        within_s=timeout_s,
    )


async def test_an_approver_approves_over_the_api_and_the_call_runs_once_and_reports_its_result(
    inproc_gateway: Gateway, inproc_backend: Backend
) -> None:
    gateway, backend = inproc_gateway, inproc_backend
    pending = await request_refund(gateway, "big-1")
    bob = gateway.token("bob", roles="approver")

    decided = decide(gateway, pending["approvalId"], bob, reason="customer sent photos")
    assert decided.status_code == 200, decided.text
    assert decided.json()["status"] == "approved" and decided.json()["decided_by"] == "bob"

    done = await settled(gateway, pending["toolCallId"], bob)
    assert done["status"] == "completed"
    assert len(backend.refunds("big-1")) == 1
    async with gateway.client(gateway.token("alice")) as client:
        status = await client.call_tool("writ_call_status", {"toolCallId": pending["toolCallId"]})
        assert status.structured_content["status"] == "completed"
        assert status.structured_content["result"]["structuredContent"]["status"] == "succeeded"
        again = await client.call_tool("refund_order", refund_args(), meta={"writ/idempotencyKey": "big-1"})
        assert again.meta["writ/toolCallId"] == pending["toolCallId"]
        assert again.meta["writ/status"] == "completed"
        assert again.structured_content["status"] == "succeeded"

    replay = decide(gateway, pending["approvalId"], bob)
    assert (replay.status_code, replay.json()["error"]) == (409, "already_decided")
    assert len(backend.refunds("big-1")) == 1


async def test_decisions_are_refused_with_clear_codes(
    inproc_gateway: Gateway, inproc_backend: Backend
) -> None:
    gateway, backend = inproc_gateway, inproc_backend
    refunds = backend.refunds()
    pending = await request_refund(gateway, "big-2", who="alice", roles="agent,approver")
    approval_id = pending["approvalId"]

    own = decide(gateway, approval_id, gateway.token("alice", roles="agent,approver"))
    assert (own.status_code, own.json()["error"]) == (403, "self_approval_forbidden")
    agent = decide(gateway, approval_id, gateway.token("carol", roles="agent"))
    assert (agent.status_code, agent.json()["error"]) == (403, "not_approver")
    other_tenant = decide(gateway, approval_id, gateway.token("eve", roles="approver", tenant="other"))
    assert (other_tenant.status_code, other_tenant.json()["error"]) == (404, "not_found")
    bad = decide(gateway, approval_id, gateway.token("bob", roles="approver"), decision="maybe")
    assert (bad.status_code, bad.json()["error"]) == (400, "invalid_request")
    anonymous = httpx2.post(f"{gateway.url}/api/approvals/{approval_id}/decision", json={}, timeout=10)
    assert anonymous.status_code == 401

    rejected = decide(gateway, approval_id, gateway.token("bob", roles="approver"), "reject", reason="no")
    assert rejected.json()["status"] == "rejected"
    late = decide(gateway, approval_id, gateway.token("dan", roles="approver"))
    assert (late.status_code, late.json()["error"]) == (409, "already_decided")
    done = await settled(gateway, pending["toolCallId"], gateway.token("bob", roles="approver"))
    assert done["status"] == "rejected"
    assert backend.refunds() == refunds


def standing_events(gateway: Gateway, approval_id: str) -> list[dict[str, Any]]:
    exported = gateway.exported().splitlines()
    return [
        e
        for e in map(json.loads, exported)
        if e["approval_id"] == approval_id and e["type"] in ("approval.granted", "approval.rejected")
    ]


async def test_the_cli_decides_only_with_a_token_checked_as_the_api_checks_it(
    inproc_gateway: Gateway, inproc_backend: Backend
) -> None:
    gateway, backend = inproc_gateway, inproc_backend
    yes = await request_refund(gateway, "cli-yes")
    no = await request_refund(gateway, "cli-no")

    named = gateway.cli("approvals", "approve", yes["approvalId"], "--as", "carol", check=False)
    assert named.returncode == 2 and "--as is gone" in named.stderr and "--token" in named.stderr
    bare = gateway.cli("approvals", "approve", yes["approvalId"], check=False, env={"WRIT_TOKEN": ""})
    assert bare.returncode == 2 and "no token was given" in bare.stderr and "--break-glass" in bare.stderr
    forged = gateway.cli("approvals", "approve", yes["approvalId"], "--token", "x.y.z", check=False)
    assert forged.returncode == 1 and "did not verify" in forged.stderr
    alice = gateway.token("alice", roles="agent,approver")
    own = gateway.cli("approvals", "approve", yes["approvalId"], "--token", alice, check=False)
    assert own.returncode == 1 and "self_approval_forbidden" in own.stderr
    agent = gateway.token("carol", roles="agent")
    unroled = gateway.cli("approvals", "approve", yes["approvalId"], "--token", agent, check=False)
    assert unroled.returncode == 1 and "not_approver" in unroled.stderr
    elsewhere = gateway.token("carol", roles="approver", tenant="globex")
    crossing = gateway.cli("approvals", "approve", yes["approvalId"], "--token", elsewhere, check=False)
    assert crossing.returncode == 1 and "not_found" in crossing.stderr
    dan_name = fresh("dan")
    dan = gateway.token(dan_name, roles="approver,admin")
    root = gateway.token("root", "admin")
    gateway.cli("principals", "revoke", dan_name, "--tenant", "acme", "--token", root)
    revoked = gateway.cli("approvals", "approve", yes["approvalId"], "--token", dan, check=False)
    assert revoked.returncode == 1 and "principal_revoked" in revoked.stderr
    assert standing_events(gateway, yes["approvalId"]) == []

    carol = gateway.token("carol", roles="approver")
    approved = gateway.cli("approvals", "approve", yes["approvalId"], "--token", carol, "--reason", "ok")
    assert '"decided_by": "carol"' in approved.stdout
    gateway.cli("approvals", "reject", no["approvalId"], "--reason", "duplicate", env={"WRIT_TOKEN": carol})

    bob = gateway.token("bob", roles="approver")
    assert (await settled(gateway, yes["toolCallId"], bob))["status"] == "completed"
    assert (await settled(gateway, no["toolCallId"], bob))["status"] == "rejected"
    assert len(backend.refunds("cli-yes")) == 1 and backend.refunds("cli-no") == []
    again = gateway.cli("approvals", "approve", yes["approvalId"], "--token", bob, check=False)
    assert again.returncode == 1 and "already_decided" in again.stderr
    decided = standing_events(gateway, yes["approvalId"]) + standing_events(gateway, no["approvalId"])
    marks = [(e["payload"]["decided_by"], e["payload"]["break_glass"], e["producer"]) for e in decided]
    assert marks == [("carol", False, "writ-cli"), ("carol", False, "writ-cli")]


async def test_a_break_glass_operator_decides_under_their_own_marked_name(inproc_gateway: Gateway) -> None:
    gateway = inproc_gateway
    pending = await request_refund(gateway, "cli-glass")
    unexplained = gateway.cli("approvals", "approve", pending["approvalId"], "--break-glass", check=False)
    assert unexplained.returncode == 2 and "needs --reason" in unexplained.stderr
    both = gateway.cli(
        "approvals", "approve", pending["approvalId"], "--break-glass", "--reason", "idp down",
        "--token", gateway.token("carol", roles="approver"), check=False,
    )  # fmt: skip
    assert both.returncode == 2 and "drop one of them" in both.stderr
    assert standing_events(gateway, pending["approvalId"]) == []

    approved = gateway.cli(
        "approvals", "approve", pending["approvalId"], "--break-glass", "--reason", "idp down, ticket 42",
        env={"WRIT_TOKEN": ""},
    )  # fmt: skip
    operator = f"operator:{getpass.getuser()}@{socket.gethostname()}"
    assert json.loads(approved.stdout)["decided_by"] == operator
    [event] = standing_events(gateway, pending["approvalId"])
    assert event["payload"] == {
        "decided_by": operator,
        "reason": "idp down, ticket 42",
        "break_glass": True,
        "decided_by_roles": None,  # an operator at the store holds no token, so no roles
        "withdrawn": None,  # decided on its merits, not withdrawn by a run's stop
    }
    bob = gateway.token("bob", roles="approver")
    assert (await settled(gateway, pending["toolCallId"], bob))["status"] == "completed"


@pytest.fixture
def acme_here(tmp_path: Path) -> Iterator[Backend]:
    """acme-payments served in this process, for a case of its own: only `writ` processes are killed."""
    with inproc.acme(tmp_path) as backend:
        yield backend


@pytest.mark.e2e
async def test_a_call_awaiting_approval_survives_kill_9_of_every_writ_process_and_runs_once(
    tmp_path: Path, acme_here: Backend, store_url: str
) -> None:
    backend = acme_here
    with writ_gateway(tmp_path, backend, store_url) as first:
        pending = await request_refund(first, "survivor")
        first.process.send_signal(signal.SIGKILL)
        first.process.wait(timeout=10)
    assert backend.refunds() == []

    with writ_gateway(tmp_path, backend, store_url) as second:
        bob = second.token("bob", roles="approver")
        listed = httpx2.get(
            f"{second.url}/api/approvals?status=awaiting_approval",
            headers={"Authorization": f"Bearer {bob}"},
            timeout=10,
        ).json()["approvals"]
        assert [a["approval_id"] for a in listed] == [pending["approvalId"]]
        assert decide(second, pending["approvalId"], bob).status_code == 200
        assert (await settled(second, pending["toolCallId"], bob))["status"] == "completed"
        assert decide(second, pending["approvalId"], bob).status_code == 409

    with writ_gateway(tmp_path, backend, store_url) as third:  # and once more: nothing runs again
        bob = third.token("bob", roles="approver")
        assert (await settled(third, pending["toolCallId"], bob))["status"] == "completed"
    assert len(backend.refunds("survivor")) == 1
