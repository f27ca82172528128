"""What a client of either era hears from the real gateway: denials, approval_pending, protocol errors,
refused arguments, call status scoped to its reader. In-process (`inproc.py`): no process is started."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from mcp.shared.exceptions import MCPError

from tests.gateway.mcp.inproc import Backend, Writ, acme, writ
from tests.postgres import module_store_url

pytestmark = pytest.mark.anyio

ERAS = ["legacy", "2026-07-28"]


# One backend and one gateway per module and store: each case keeps apart by its own keys and
# principals, and compares the backend's refunds with what they were before it.
store_url = module_store_url("writ_inproc")


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory, store_url: str) -> Iterator[Backend]:
    with acme(tmp_path_factory.mktemp("acme")) as b:
        yield b


GOODWILL_SAYS = "Goodwill refunds are approved by a supervisor; expect an answer within a day."
GOODWILL = {  # an approval rule with a message for the user (the demo's own approval rule has none)
    "id": "goodwill-refunds-need-approval",
    "tools": ["refund_order"],
    "roles": ["agent"],
    "when": 'args.reason == "goodwill"',
    "decision": "require_approval",
    "reason": "goodwill_refund",
    "message": GOODWILL_SAYS,
    "approval": {"approver_role": "approver", "expires_in": "1h"},
}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, backend: Backend, store_url: str) -> Iterator[Writ]:
    workdir: Path = tmp_path_factory.mktemp("writ")
    with writ(workdir, backend, store_url, extra_rules=[GOODWILL]) as g:
        yield g


def fresh(name: str) -> str:
    """A key or subject no other case uses."""
    return f"{name}-{uuid.uuid4().hex[:8]}"


def refund_args(amount: float = 20, order: str = "1002", currency: str = "EUR") -> dict[str, object]:
    return {"order_id": order, "amount": amount, "currency": currency, "reason": "damaged in transit"}


async def test_the_same_key_with_other_arguments_is_refused_as_an_idempotency_conflict(
    gateway: Writ, backend: Backend
) -> None:
    k = fresh("k")
    async with gateway.client(gateway.token("alice")) as client:
        await client.call_tool("refund_order", refund_args(20), meta={"writ/idempotencyKey": k})
        other = await client.call_tool("refund_order", refund_args(30), meta={"writ/idempotencyKey": k})
    assert other.is_error is False
    assert other.structured_content["status"] == "denied"
    assert other.structured_content["reason"] == "idempotency_conflict"
    assert [r["amount"] for r in backend.refunds(k)] in (["20.00"], [20], [20.0], ["20"])
    assert "tool_call.denied" in gateway.event_types(other.structured_content["toolCallId"])


async def test_a_refund_over_the_threshold_waits_for_approval_and_says_so(
    gateway: Writ, backend: Backend
) -> None:
    before = backend.refunds()
    async with gateway.client(gateway.token(fresh("alice"))) as client:
        result = await client.call_tool("refund_order", refund_args(250, order="1002"))
        body = result.structured_content
        assert body["status"] == "approval_pending"
        assert body["approvalId"].startswith("ap_") and body["expiresAt"]
        assert body["effect"] == {"capability": "refund-order@2", "summary": "refund 250 EUR to order 1002"}
        assert "Do not call again" in body["next"]
        status = await client.call_tool("writ_call_status", {"toolCallId": body["toolCallId"]})
        assert status.structured_content["status"] == "approval_pending"
    assert backend.refunds() == before
    # What the approver is asked to let happen, as `writ approvals list` shows it (the CLI in process).
    approvals = gateway.cli("approvals", "list").stdout
    assert body["approvalId"] in approvals and "awaiting_approval" in approvals
    assert "refund 250 EUR to order 1002" in approvals


async def test_a_refund_over_the_limit_is_denied_with_a_reason_and_never_dispatched(
    gateway: Writ, backend: Backend
) -> None:
    before = backend.refunds()
    async with gateway.client(gateway.token("alice")) as client:
        result = await client.call_tool("refund_order", refund_args(20000, order="1003", currency="USD"))
    assert result.is_error is False
    assert result.structured_content["status"] == "denied"
    assert result.structured_content["reason"] == "amount_over_limit"
    assert result.structured_content["policyVersion"]
    assert backend.refunds() == before


async def test_a_denial_by_a_rule_with_a_message_tells_the_client_that_message_and_records_it(
    gateway: Writ,
) -> None:
    said = "Refunds over 10000 go through finance, not an agent."  # demo.yaml's rule, as written
    async with gateway.client(gateway.token(fresh("alice"))) as client:
        result = await client.call_tool("refund_order", refund_args(20000, order="1003", currency="USD"))
        status = await client.call_tool(
            "writ_call_status", {"toolCallId": result.structured_content["toolCallId"]}
        )
    body = result.structured_content
    assert (body["status"], body["reason"], body["message"]) == ("denied", "amount_over_limit", said)
    assert body["policyVersion"]
    text = result.content[0].text
    assert text.startswith("Denied by policy (amount_over_limit): refund 20000 USD to order 1003.")
    assert said in text and "also matched" not in text
    assert status.structured_content["message"] == said
    with gateway.store() as store:
        events = store.events(tool_call_id=body["toolCallId"])
    denied = next(e for e in events if e.type == "tool_call.denied")
    assert (denied.payload["rule_id"], denied.payload["message"]) == ("refunds-over-10000-denied", said)
    decision = next(e for e in events if e.type == "tool_call.requested").payload["decision"]
    assert decision["message"] == said
    assert decision["also_matched"] == ["agents-refund", "refunds-over-100-need-approval"]


async def test_a_denial_without_a_rules_message_gives_the_client_no_message(gateway: Writ) -> None:
    async with gateway.client(gateway.token(fresh("mallory"), roles="viewer")) as client:
        result = await client.call_tool("refund_order", refund_args())
    assert result.structured_content["reason"] == "no_matching_rule"
    assert "message" not in result.structured_content


@pytest.mark.parametrize("mode", ERAS)
async def test_an_approval_by_a_rule_with_a_message_tells_the_client_that_message_every_time(
    gateway: Writ, backend: Backend, mode: str
) -> None:
    before, key, token = backend.refunds(), fresh("k"), gateway.token(fresh("alice"))
    args = {**refund_args(20, order="1001"), "reason": "goodwill"}
    async with gateway.client(token, mode=mode) as client:
        first = await client.call_tool("refund_order", args, meta={"writ/idempotencyKey": key})
        body = first.structured_content
        status = await client.call_tool("writ_call_status", {"toolCallId": body["toolCallId"]})
        again = await client.call_tool("refund_order", args, meta={"writ/idempotencyKey": key})
    assert (body["status"], body["message"]) == ("approval_pending", GOODWILL_SAYS)
    assert first.content[0].text.startswith(
        f"Waiting for human approval: refund 20 EUR to order 1001. The policy says: {GOODWILL_SAYS} Do not"
    )
    # A later poll, and a retry under the same key (which joins the call), say it again.
    for later in (status, again):
        assert later.structured_content["toolCallId"] == body["toolCallId"]
        assert later.structured_content["status"] == "approval_pending"
        assert later.structured_content["message"] == GOODWILL_SAYS
        assert f"The policy says: {GOODWILL_SAYS}" in later.content[0].text
    assert backend.refunds() == before
    with gateway.store() as store:
        [requested] = store.events(tool_call_id=body["toolCallId"], limit=1)
    # Where the message comes from: the decision recorded with the call's intent.
    assert requested.payload["decision"]["message"] == GOODWILL_SAYS
    # The API and `writ calls show` tell the call's state as the client hears it, message and all.
    bearer = {"Authorization": f"Bearer {token}"}
    api = httpx2.get(f"{gateway.url}/api/calls/{body['toolCallId']}", headers=bearer, timeout=10)
    assert (api.status_code, api.json()["status"], api.json().get("message")) == (
        200,
        "approval_pending",
        GOODWILL_SAYS,
    )
    shown = json.loads(gateway.cli("calls", "show", body["toolCallId"]).stdout)
    assert (shown["status"], shown.get("message")) == ("approval_pending", GOODWILL_SAYS)


async def test_an_approval_by_a_rule_without_a_message_gives_the_client_no_message(gateway: Writ) -> None:
    async with gateway.client(gateway.token(fresh("alice"))) as client:
        first = await client.call_tool("refund_order", refund_args(250, order="1002"))
        status = await client.call_tool(
            "writ_call_status", {"toolCallId": first.structured_content["toolCallId"]}
        )
    for said in (first, status):  # demo.yaml's refunds-over-100-need-approval has no message
        assert said.structured_content["status"] == "approval_pending"
        assert "message" not in said.structured_content
        assert "policy says" not in said.content[0].text
        # Nor does Writ's own account of the match (the other rules that matched) pass for one.
        assert "agents-refund" not in said.content[0].text


async def test_a_principal_without_the_agent_role_sees_no_backend_tools_and_is_denied(
    gateway: Writ, backend: Backend
) -> None:
    before = backend.refunds()
    async with gateway.client(gateway.token("mallory", roles="viewer")) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        assert names == {"writ_call_status"}
        result = await client.call_tool("refund_order", refund_args())
    assert result.structured_content["status"] == "denied"
    assert result.structured_content["reason"] == "no_matching_rule"
    assert backend.refunds() == before


@pytest.mark.parametrize("mode", ERAS)
async def test_an_unknown_tool_is_a_protocol_error(gateway: Writ, mode: str) -> None:
    async with gateway.client(gateway.token("alice"), mode=mode) as client:
        with pytest.raises(MCPError, match="Unknown tool"):
            await client.call_tool("transfer_everything", {})


async def test_arguments_failing_the_schema_are_refused_recorded_and_not_dispatched(
    gateway: Writ, backend: Backend
) -> None:
    before = backend.refunds()
    async with gateway.client(gateway.token("alice")) as client:
        result = await client.call_tool(
            "refund_order", {"order_id": "1001", "amount": -5, "currency": "euro"}
        )
    assert result.is_error is True
    body = result.structured_content
    assert body["status"] == "denied" and body["reason"] == "invalid_arguments"
    joined = " ".join(body["errors"])
    assert "reason" in joined and "amount" in joined and "currency" in joined
    assert backend.refunds() == before
    shown = gateway.event_types(body["toolCallId"])
    assert (
        "tool_call.requested" in shown
        and "tool_call.denied" in shown
        and "tool_call.dispatching" not in shown
    )
    # The refused call is listed with the effect it asked for (the line was blank).
    listed = {call.tool_call_id: call.summary for call in gateway.recorded_calls()}
    assert listed[body["toolCallId"]] == "refund -5 euro to order 1001"


async def test_call_status_of_another_tenants_call_is_not_found(gateway: Writ) -> None:
    async with gateway.client(gateway.token("alice")) as client:
        done = await client.call_tool("lookup_order", {"order_id": "1001"})
    async with gateway.client(gateway.token("eve", tenant="other")) as client:
        status = await client.call_tool("writ_call_status", {"toolCallId": done.meta["writ/toolCallId"]})
    assert status.is_error is True
    assert status.structured_content["status"] == "not_found"


async def test_call_status_of_someone_elses_call_in_the_tenant_is_not_found_unless_overseeing(
    gateway: Writ,
) -> None:
    # The same rule as /api/calls: an agent reads its own calls; an approver or auditor the tenant's.
    async with gateway.client(gateway.token("alice")) as client:
        done = await client.call_tool("lookup_order", {"order_id": "1001"})
    call_id = done.meta["writ/toolCallId"]
    async with gateway.client(gateway.token("bob")) as client:
        status = await client.call_tool("writ_call_status", {"toolCallId": call_id})
    assert status.is_error is True
    assert status.structured_content == {"status": "not_found", "toolCallId": call_id}
    async with gateway.client(gateway.token("carol", roles="agent,auditor")) as client:
        status = await client.call_tool("writ_call_status", {"toolCallId": call_id})
    assert status.structured_content["status"] == "completed"
