"""A person settles an unknown call over the real gateway's API, in process (`gateway/mcp/inproc.py`):
an approver may, an agent may not (nor the agent holding the approver role too, its own call), another
tenant's approver does not see the call, and a second answer is a conflict. The rules themselves:
`gateway/calls/test_resolutions.py`."""

from __future__ import annotations

from pathlib import Path

import httpx2
import pytest

from tests.gateway.mcp.inproc import acme, writ

pytestmark = pytest.mark.anyio

ARGS = {"order_id": "1002", "amount": 15, "currency": "EUR", "reason": "late delivery"}


async def test_an_approver_resolves_an_unknown_call_over_the_api_and_an_agent_may_not(tmp_path: Path) -> None:
    # No workers: the unknown call stays unknown until a person settles it.
    store_url = f"sqlite:///{tmp_path / 'writ.db'}"
    config = {"timeout_s": 0.5, "overrides": {"workers": {"enabled": False}}}
    with acme(tmp_path) as backend, writ(tmp_path, backend, store_url, **config) as gateway:
        httpx2.post(f"{backend.url}/_chaos", json={"hang": 1}, timeout=5).raise_for_status()
        async with gateway.client(gateway.token("alice")) as client:
            first = await client.call_tool("refund_order", ARGS, meta={"writ/idempotencyKey": "by-hand"})
        assert first.structured_content["status"] == "result_unknown"
        tool_call_id = first.meta["writ/toolCallId"]
        url = f"{gateway.url}/api/calls/{tool_call_id}/resolution"
        body = {"outcome": "failed", "evidence": "no refund in the bank statement"}
        agent = {"Authorization": f"Bearer {gateway.token('alice')}"}
        maker = {"Authorization": f"Bearer {gateway.token('alice', roles='agent,approver')}"}
        approver = {"Authorization": f"Bearer {gateway.token('bob', roles='approver')}"}
        outsider = {"Authorization": f"Bearer {gateway.token('eve', roles='approver', tenant='other')}"}

        assert httpx2.post(url, json=body, headers=agent, timeout=10).status_code == 403
        own = httpx2.post(url, json=body, headers=maker, timeout=10)
        assert (own.status_code, own.json()["error"]) == (403, "self_resolution_forbidden")
        assert httpx2.post(url, json=body, headers=outsider, timeout=10).status_code == 404
        answer = httpx2.post(url, json=body, headers=approver, timeout=10)
        again = httpx2.post(url, json=body, headers=approver, timeout=10)
        events = gateway.runtime.store.events(tool_call_id=tool_call_id)

    assert answer.status_code == 200, answer.text
    assert (answer.json()["status"], answer.json()["verification"]) == ("failed", "confirmed_failure")
    assert answer.json()["resolvedBy"] == "bob"
    assert again.status_code == 409
    assert events[-1].payload["resolved_by"] == "bob"
