"""Answers that do not settle a call: a refusal of a re-send under the same key, and an upstream MCP
tool's error, which may follow its effect (DESIGN §3: unknown is not failed).

Real processes: `writ serve`, a slow payments backend that deduplicates on the key as Stripe does
(tests/e2e/deduping_backend.py), and stdio upstreams on the SDK's own `MCPServer`
(tests/e2e/ledger_upstream.py) that the gateway starts; the official MCP client talks to the gateway.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from string import Template
from typing import Any

import httpx2
import pytest
import yaml

from store.keys import scoped_key
from tests.e2e import deduping_backend
from tests.e2e.harness import QUICK_LEASE_MARGIN_S, REPO, Backend, Gateway, backend_process, writ_gateway
from tests.eventually import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

LEDGER_UPSTREAM = Path(__file__).with_name("ledger_upstream.py")
HOLD_S = 4.0
"""How long the payments backend takes to commit, far past the gateway's timeout."""
TIMEOUT_S = 0.5
WORKERS = {
    "interval_s": 0.2,
    "executor_grace_s": 0.3,
    "lease_margin_s": QUICK_LEASE_MARGIN_S,
    "reconcile_backoff_s": 0.5,
    "reconcile_backoff_max_s": 1.0,
    "reconcile_max_attempts": 15,
}
PAY = {
    "id": "pay",
    "version": "1",
    "tool": "pay",
    "backend": "payments",
    "effect": "write",
    "description": "Pay an invoice.",
    "input_schema": {
        "type": "object",
        "properties": {"invoice": {"type": "string"}, "amount": {"type": "number"}},
        "required": ["invoice", "amount"],
    },
    "request": {"method": "POST", "path": "/payments"},
    "dedupes_on_key": True,
}
ALLOWED = {
    "id": "agents-pay-and-transfer",
    "tools": ["pay", "transfer", "strict_transfer", "balance"],
    "roles": ["agent"],
    "decision": "allow",
}


@pytest.fixture(scope="module")
def payments() -> Iterator[Backend]:
    with backend_process(deduping_backend.__name__, "--hold-s", str(HOLD_S)) as backend:
        yield backend


def capabilities() -> list[dict[str, Any]]:
    """The demo's capabilities (its policy names them), and `pay`."""
    text = Template((REPO / "demo" / "demo.yaml").read_text())
    demo = yaml.safe_load(text.safe_substitute(gateway_port=0, backend_port=0, state_dir="."))
    return [*demo["capabilities"], PAY]


def ledger(path: Path, **settings: Any) -> dict[str, Any]:
    return {
        "type": "mcp",
        "command": [sys.executable, str(LEDGER_UPSTREAM), str(path)],
        "timeout_s": 10,
        **settings,
    }


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("writ")


@pytest.fixture(scope="module")
def gateway(workdir: Path, payments: Backend) -> Iterator[Gateway]:
    backends = {
        "payments": {"type": "http", "base_url": payments.url, "timeout_s": TIMEOUT_S},
        # A tool error may follow the effect (the default): looked up by key.
        "ledger": ledger(
            workdir / "ledger.json",
            tools=["transfer", "balance"],
            overrides={
                "transfer": {
                    "reconcile": {"tool": "find_transfer", "arguments": {"key": "{idempotency_key}"}}
                }
            },
        ),
        # The operator declares that this upstream reports tool errors only before any effect.
        "strict": ledger(
            workdir / "strict.json",
            tools=["transfer"],
            rename={"transfer": "strict_transfer"},
            defaults={"tool_errors": "before_effect"},
        ),
    }
    # The acme backend of the demo's own capabilities is never called here.
    with writ_gateway(
        workdir,
        payments,
        f"sqlite:///{workdir / 'writ.db'}",
        timeout_s=TIMEOUT_S,
        overrides={"workers": WORKERS, "capabilities": capabilities()},
        extra_backends=backends,
        extra_rules=[ALLOWED],
    ) as g:
        yield g


def payments_under(backend: Backend, key: str) -> list[dict[str, Any]]:
    answer = httpx2.get(f"{backend.url}/payments", params={"idempotency_key": key}, timeout=5)
    payments: list[dict[str, Any]] = answer.json()["payments"]
    return payments


def transfers(path: Path) -> list[dict[str, Any]]:
    return json.loads(path.read_text()) if path.exists() else []


async def statuses_until_settled(client: Any, tool_call_id: str, seen: list[str]) -> dict[str, Any]:
    """`writ_call_status` asked until the call is settled, each status it reported appended to `seen`."""

    async def status() -> dict[str, Any]:
        answer = await client.call_tool("writ_call_status", {"toolCallId": tool_call_id})
        body: dict[str, Any] = answer.structured_content or {}
        seen.append(body["status"])
        return body

    return await eventually(
        status, lambda s: s["status"] not in ("result_unknown", "dispatching"), within_s=60
    )


async def test_a_re_send_refused_while_the_first_request_runs_never_reads_failed_and_completes_once(
    gateway: Gateway, payments: Backend
) -> None:
    seen: list[str] = []
    async with gateway.client(gateway.token("alice")) as client:
        first = await client.call_tool(
            "pay", {"invoice": "inv-1", "amount": 40}, meta={"writ/idempotencyKey": "pay-1"}
        )
        assert first.structured_content is not None
        assert first.structured_content["status"] == "result_unknown", first.structured_content
        tool_call_id = first.meta["writ/toolCallId"] if first.meta else ""
        settled = await statuses_until_settled(client, tool_call_id, seen)

    assert "failed" not in seen
    assert (settled["status"], settled["verification"]) == ("completed", "not_observed")
    # The backend holds the one effect, under alice's own key.
    [payment] = payments_under(payments, scoped_key("acme", "alice", "pay-1"))
    with gateway.store() as store:
        call = store.get_call(tool_call_id)
        events = store.events(tool_call_id=tool_call_id)
        assert store.verify().ok
    assert call is not None and payment["request_id"] == call.external_request_id
    assert settled["result"]["structuredContent"] == payment
    types = [e.type for e in events]
    assert "tool_call.failed" not in types
    # The re-sends the backend refused while the first request ran, each recorded as evidence.
    refused = [e for e in events if e.type == "tool_call.result_unknown" and e.payload["error"] == "http_409"]
    assert refused, types
    assert all(e.payload["evidence"]["resend_attempt"] >= 2 for e in refused)
    assert "in progress" in refused[0].payload["detail"]
    assert call.attempts == types.count("tool_call.dispatching") >= 3


async def test_an_upstream_tool_that_errs_after_its_effect_is_unknown_then_found_and_not_repeated(
    gateway: Gateway, workdir: Path
) -> None:
    arguments = {"to": "printer", "amount": 13}
    key = {"writ/idempotencyKey": "transfer-1"}
    seen: list[str] = []
    async with gateway.client(gateway.token("bob")) as client:
        first = await client.call_tool("transfer", arguments, meta=key)
        again = await client.call_tool("transfer", arguments, meta=key)
        tool_call_id = first.meta["writ/toolCallId"] if first.meta else ""
        settled = await statuses_until_settled(client, tool_call_id, seen)
        after = await client.call_tool("transfer", arguments, meta=key)

    told = first.structured_content or {}
    assert (first.is_error, told["status"], told["reconciliation"]) == (False, "result_unknown", "pending")
    # The tool's own message reaches the model, whose call stays unknown.
    assert told["detail"] == "Error executing tool transfer"
    text = first.content[0].text  # type: ignore[union-attr]
    assert "the tool reported an error" in text and "Error executing tool transfer" in text
    assert again.meta is not None and again.meta["writ/toolCallId"] == tool_call_id
    assert "failed" not in seen
    assert (settled["status"], settled["verification"]) == ("completed", "confirmed_success")
    assert after.meta is not None and after.meta["writ/toolCallId"] == tool_call_id
    assert after.meta["writ/status"] == "completed"
    [row] = transfers(workdir / "ledger.json")  # one transfer: looked up, never sent again
    assert (row["to"], row["amount"], row["key"]) == ("printer", 13, scoped_key("acme", "bob", "transfer-1"))
    with gateway.store() as store:
        events = store.events(tool_call_id=tool_call_id)
        assert store.verify().ok
    [unknown] = [e for e in events if e.type == "tool_call.result_unknown"]
    assert unknown.payload["error"] == "tool_error"
    assert unknown.payload["evidence"]["answer"]["isError"] is True
    assert events[-1].payload["evidence"]["lookup_tool"] == "find_transfer"


async def test_a_tool_error_of_an_upstream_declared_to_err_before_any_effect_is_failed(
    gateway: Gateway, workdir: Path
) -> None:
    async with gateway.client(gateway.token("carol")) as client:
        result = await client.call_tool(
            "strict_transfer", {"to": "nobody", "amount": 5}, meta={"writ/idempotencyKey": "strict-1"}
        )
        status = await client.call_tool("writ_call_status", {"toolCallId": result.meta["writ/toolCallId"]})  # type: ignore[index]

    assert result.is_error
    said = result.content[0].text  # type: ignore[union-attr]
    assert said == "Error executing tool transfer: no account named nobody: nothing was moved"
    assert (status.structured_content or {})["status"] == "failed"
    assert (status.structured_content or {})["error"] == "tool_error"
    assert transfers(workdir / "strict.json") == []


async def test_a_read_only_tools_error_is_failed(gateway: Gateway) -> None:
    async with gateway.client(gateway.token("dave")) as client:
        result = await client.call_tool("balance", {"account": "erin"})

    assert result.is_error
    assert result.content[0].text == "Error executing tool balance: no balance is kept for erin"  # type: ignore[union-attr]
    assert result.meta is not None and result.meta["writ/status"] == "failed"
