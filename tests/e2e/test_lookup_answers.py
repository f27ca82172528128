"""Refunds of unknown outcome settled by what the backend's lookup answers, read as the capability
declares it: real processes (tests/e2e/lookup_backend.py, `writ serve`) and the official MCP client.

The lookup answers `{"refunds": [...], "warnings": []}`, an envelope Writ once took for the record of a
refund (trial 5, finding F1): a refund the backend never made was settled `completed` /
`confirmed_success`, with that envelope handed to the client as its result, and one the backend
declined as well.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest

from gateway.mcp.results import FAILED_BY
from tests.e2e.harness import QUICK_LEASE_MARGIN_S, Backend, Gateway, backend_process, writ_gateway
from tests.eventually import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

TIMEOUT_S = 1.0
HORIZON_S = 2.0
SCHEMA = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string"},
        "amount": {"type": "number"},
        "outcome": {"type": "string"},
    },
    "required": ["order_id", "amount"],
}
LOOKUP = {"method": "GET", "path": "/refunds?idempotency_key={idempotency_key}"}


def refund(tool: str, reconcile: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": tool.replace("_", "-"),
        "tool": tool,
        "backend": "acme",
        "effect": "write",
        "input_schema": SCHEMA,
        "request": {"method": "POST", "path": "/refunds"},
        "reconcile": reconcile,
    }


CAPABILITIES = [
    refund(
        "refund",
        {
            **LOOKUP,
            "records": "/refunds",
            "outcome": {"field": "/status", "succeeded": ["succeeded"], "failed": ["declined", "failed"]},
        },
    ),
    refund("refund_undeclared", LOOKUP),
]


@pytest.fixture(scope="module")
def lookup_backend() -> Iterator[Backend]:
    with backend_process("tests.e2e.lookup_backend") as backend:
        yield backend


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, lookup_backend: Backend, module_store_url: str
) -> Iterator[Gateway]:
    with writ_gateway(
        tmp_path_factory.mktemp("writ"),
        lookup_backend,
        module_store_url,
        timeout_s=TIMEOUT_S,
        commit_horizon_s=HORIZON_S,
        overrides={
            "capabilities": CAPABILITIES,
            "policy": {
                "rules": [{"id": "refunds", "tools": ["refund*"], "roles": ["agent"], "decision": "allow"}]
            },
            "workers": {
                "interval_s": 0.2,
                "reconcile_backoff_s": 0.3,
                "reconcile_max_attempts": 2,
                "lease_margin_s": QUICK_LEASE_MARGIN_S,
            },
        },
    ) as g:
        yield g


def backend_refunds(backend: Backend) -> list[dict[str, Any]]:
    refunds: list[dict[str, Any]] = httpx2.get(f"{backend.url}/_state", timeout=5).json()["refunds"]
    return refunds


async def settled(gateway: Gateway, tool: str, args: dict[str, Any], key: str) -> tuple[str, dict[str, Any]]:
    """The call made unknown (the backend stalls), and its status once it is not unknown or escalated.

    The key gets a suffix of its own: the backend serves the module's runs on both stores, and a lookup
    by key must find only this run's refund, not the other store's run's under the same key."""
    async with gateway.client(gateway.token("alice")) as client:
        key = f"{key}-{uuid.uuid4().hex[:8]}"
        first = await client.call_tool(tool, args, meta={"writ/idempotencyKey": key})
        assert first.structured_content is not None
        assert first.structured_content["status"] == "result_unknown", first.structured_content
        tool_call_id = first.meta["writ/toolCallId"]
        status = await eventually(
            lambda: client.call_tool("writ_call_status", {"toolCallId": tool_call_id}),
            lambda s: (
                s.structured_content["status"] != "result_unknown"
                or s.structured_content.get("reconciliation") == "escalated"
            ),
            within_s=30,
        )
    return tool_call_id, status.structured_content


async def test_a_refund_the_lookup_lists_nothing_for_fails_after_the_horizon_not_completed(
    gateway: Gateway, lookup_backend: Backend
) -> None:
    tool_call_id, status = await settled(gateway, "refund", {"order_id": "1", "amount": 10}, "lookup-nothing")

    assert (status["status"], status["verification"]) == ("failed", "confirmed_failure")
    assert (status["error"], status["next"]) == (
        "no_effect_after_horizon",
        FAILED_BY["no_effect_after_horizon"],
    )
    assert "result" not in status
    with gateway.store() as store:
        events = store.events(tool_call_id=tool_call_id)
        call = store.get_call(tool_call_id)
    assert call is not None
    assert [r for r in backend_refunds(lookup_backend) if r["request_id"] == call.external_request_id] == []
    verdict = next(e for e in events if e.type == "reconciliation.resolved")
    assert (verdict.payload["verdict"], verdict.payload["evidence"]["records"]) == ("confirmed_failure", 0)
    assert "tool_call.completed" not in [e.type for e in events]


async def test_a_refund_the_backend_declined_fails_as_the_backend_reports(
    gateway: Gateway, lookup_backend: Backend
) -> None:
    args = {"order_id": "2", "amount": 20, "outcome": "declined"}

    tool_call_id, status = await settled(gateway, "refund", args, "lookup-declined")

    assert (status["status"], status["verification"]) == ("failed", "confirmed_failure")
    assert status["error"] == "backend_reported_failure"
    assert status["next"] == FAILED_BY["backend_reported_failure"]
    with gateway.store() as store:
        call = store.get_call(tool_call_id)
        events = store.events(tool_call_id=tool_call_id)
    assert call is not None and call.result is None  # the lookup's answer is not the call's result
    verdict = next(e for e in events if e.type == "reconciliation.resolved")
    evidence = verdict.payload["evidence"]
    assert (evidence["verdict"], evidence["field"], evidence["state"]) == ("failed", "/status", "declined")
    assert evidence["record"]["request_id"] == call.external_request_id
    assert evidence["record"]["failure_reason"] == "card_expired"
    # Settled by the backend's own record, before the horizon: no re-check is due.
    assert "reconciliation.inconclusive" not in [e.type for e in events]
    assert verdict.payload.get("recheck_at") is None


async def test_undeclared_the_same_answers_are_never_read_as_a_refund(gateway: Gateway) -> None:
    # Two lists: one record, naming no call, so evidence of nothing; a person settles it. And a declined
    # refund's record is not a success.
    nothing_id, nothing = await settled(
        gateway, "refund_undeclared", {"order_id": "3", "amount": 5}, "undeclared-0"
    )
    declined_id, declined = await settled(
        gateway, "refund_undeclared", {"order_id": "4", "amount": 5, "outcome": "declined"}, "undeclared-1"
    )

    for status in (nothing, declined):
        assert (status["status"], status["reconciliation"], status["verification"]) == (
            "result_unknown",
            "escalated",
            "inconclusive",
        )
    with gateway.store() as store:
        reasons = {
            tool_call_id: [
                e.payload["evidence"].get("error")
                for e in store.events(tool_call_id=tool_call_id)
                if e.type in ("reconciliation.inconclusive", "reconciliation.escalated")
            ]
            for tool_call_id in (nothing_id, declined_id)
        }
    assert set(reasons[nothing_id]) == {"unidentified_record"}
    assert set(reasons[declined_id]) == {"record_state_undeclared"}
