"""Confirm-class capabilities ask the user in the client (input-required, 2026-07-28) via `writ serve`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from string import Template
from typing import Any

import httpx2
import mcp_types as types
import pytest
import yaml
from mcp.shared.exceptions import MCPError

from tests.e2e.harness import REPO, Backend, Gateway, writ_gateway

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

MODERN = "2026-07-28"


def confirm_overrides() -> dict[str, Any]:
    """The demo's capabilities and policy plus `refund_now`, a refund of class `confirm` for agents."""
    text = Template((REPO / "gateway" / "demo" / "demo.yaml").read_text())
    demo = yaml.safe_load(text.safe_substitute(gateway_port=0, backend_port=0, state_dir="."))
    refund = next(c for c in demo["capabilities"] if c["tool"] == "refund_order")
    refund_now = {
        **refund,
        "id": "refund-now",
        "version": "1",
        "tool": "refund_now",
        "effect": "confirm",
        "description": "Refund an order at once, after the user confirms it.",
    }
    rule = {"id": "agents-refund-now", "tools": ["refund_now"], "roles": ["agent"], "decision": "allow"}
    return {
        "capabilities": [*demo["capabilities"], refund_now],
        "policy": {**demo["policy"], "rules": [*demo["policy"]["rules"], rule]},
    }


@pytest.fixture
def gateway(tmp_path: Path, backend: Backend) -> Iterator[Gateway]:
    with writ_gateway(
        tmp_path, backend, f"sqlite:///{tmp_path / 'writ.db'}", overrides=confirm_overrides()
    ) as g:
        yield g


def args(order: str = "1001", amount: float = 5) -> dict[str, Any]:
    return {"order_id": order, "amount": amount, "currency": "EUR", "reason": "late delivery"}


class User:
    """An elicitation callback that answers every confirmation with `action` and remembers the asks."""

    def __init__(self, action: str) -> None:
        self.action = action
        self.asked: list[types.ElicitRequestFormParams] = []

    async def __call__(self, context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        assert isinstance(params, types.ElicitRequestFormParams)
        self.asked.append(params)
        return types.ElicitResult(action=self.action, content={} if self.action == "accept" else None)  # type: ignore[arg-type]


def events(gateway: Gateway, tool_call_id: str) -> list[str]:
    headers = {"Authorization": f"Bearer {gateway.token('auditor', roles='admin')}"}
    call = httpx2.get(f"{gateway.url}/api/calls/{tool_call_id}", headers=headers, timeout=10).json()
    run = httpx2.get(f"{gateway.url}/api/runs/{call['runId']}/events", headers=headers, timeout=10).json()
    return [e["type"] for e in run["events"] if e["tool_call_id"] == tool_call_id]


async def test_the_user_confirms_in_the_client_and_the_call_runs_once(
    gateway: Gateway, backend: Backend
) -> None:
    user = User("accept")
    async with gateway.client(gateway.token("alice"), mode=MODERN, elicitation_callback=user) as client:
        result = await client.call_tool("refund_now", args(), meta={"writ/idempotencyKey": "now-1"})

    assert result.meta is not None and result.meta["writ/status"] == "completed", result
    assert [a.message for a in user.asked] == [
        "Confirm this action: refund 5 EUR to order 1001 (refund-now@1), requested by alice. "
        "Accept to run it once; decline to cancel it."
    ]
    assert len(backend.refunds("now-1")) == 1
    assert events(gateway, result.meta["writ/toolCallId"])[-4:] == [
        "confirmation.required",
        "confirmation.given",
        "tool_call.dispatching",
        "tool_call.completed",
    ]


@pytest.mark.parametrize(("action", "reason"), [("decline", "user_declined"), ("cancel", "user_cancelled")])
async def test_the_user_declines_and_nothing_is_sent(
    gateway: Gateway, backend: Backend, action: str, reason: str
) -> None:
    async with gateway.client(
        gateway.token("alice"), mode=MODERN, elicitation_callback=User(action)
    ) as client:
        result = await client.call_tool("refund_now", args(), meta={"writ/idempotencyKey": "now-2"})

    assert (result.structured_content["status"], result.structured_content["reason"]) == ("denied", reason)
    assert backend.refunds("now-2") == []


async def first_round(client: Any, key: str) -> types.InputRequiredResult:
    first = await client.session.call_tool(
        "refund_now", args(), meta={"writ/idempotencyKey": key}, allow_input_required=True
    )
    assert isinstance(first, types.InputRequiredResult), first
    return first


ACCEPT = {"writ/confirm": types.ElicitResult(action="accept", content={})}


async def test_a_replayed_confirmation_is_refused_and_runs_nothing_again(
    gateway: Gateway, backend: Backend
) -> None:
    async with gateway.client(
        gateway.token("alice"), mode=MODERN, elicitation_callback=User("accept")
    ) as client:
        first = await first_round(client, "now-3")
        assert first.input_requests is not None and list(first.input_requests) == ["writ/confirm"]

        async def answer() -> Any:
            return await client.session.call_tool(
                "refund_now",
                args(),
                meta={"writ/idempotencyKey": "now-3"},
                input_responses=ACCEPT,
                request_state=first.request_state,
                allow_input_required=True,
            )

        done = await answer()
        assert done.meta["writ/status"] == "completed"
        replay = await answer()

    assert replay.is_error and replay.structured_content["reason"] == "confirmation_used"
    assert len(backend.refunds("now-3")) == 1


async def test_a_confirmation_for_other_arguments_is_refused_by_the_state_binding(
    gateway: Gateway, backend: Backend
) -> None:
    async with gateway.client(
        gateway.token("alice"), mode=MODERN, elicitation_callback=User("accept")
    ) as client:
        first = await first_round(client, "now-4")
        with pytest.raises(MCPError, match="Invalid or expired requestState"):
            await client.session.call_tool(
                "refund_now",
                args(amount=9000),
                meta={"writ/idempotencyKey": "now-4"},
                input_responses=ACCEPT,
                request_state=first.request_state,
                allow_input_required=True,
            )
    assert backend.refunds("now-4") == []
    assert backend.refunds() == []


async def test_a_confirmation_from_before_a_restart_is_refused_and_runs_nothing(
    tmp_path: Path, backend: Backend
) -> None:
    store_url = f"sqlite:///{tmp_path / 'writ.db'}"
    with writ_gateway(tmp_path, backend, store_url, overrides=confirm_overrides()) as before:
        async with before.client(
            before.token("alice"), mode=MODERN, elicitation_callback=User("accept")
        ) as client:
            first = await first_round(client, "now-5")
            tool_call_id = (first.meta or {})["writ/toolCallId"]

    with writ_gateway(tmp_path, backend, store_url, overrides=confirm_overrides()) as after:
        async with after.client(
            after.token("alice"), mode=MODERN, elicitation_callback=User("accept")
        ) as client:
            with pytest.raises(MCPError, match="Invalid or expired requestState"):
                await client.session.call_tool(
                    "refund_now",
                    args(),
                    meta={"writ/idempotencyKey": "now-5"},
                    input_responses=ACCEPT,
                    request_state=first.request_state,
                    allow_input_required=True,
                )
            status = await client.call_tool("writ_call_status", {"toolCallId": tool_call_id})
        assert status.structured_content["status"] == "awaiting_confirmation"
        assert "confirmation.given" not in events(after, tool_call_id)
    assert backend.refunds("now-5") == []


async def test_a_client_that_cannot_be_asked_is_refused_and_nothing_is_sent(
    gateway: Gateway, backend: Backend
) -> None:
    for mode, callback in (("legacy", User("accept")), (MODERN, None)):
        async with gateway.client(gateway.token("alice"), mode=mode, elicitation_callback=callback) as client:
            result = await client.call_tool("refund_now", args(), meta={"writ/idempotencyKey": f"now-{mode}"})
        assert result.structured_content["reason"] == "confirmation_unavailable", (mode, result)
    assert backend.refunds() == []
