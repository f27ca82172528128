"""Unknown outcomes from the demo backend's /_chaos faults, settled by reconciliation (DESIGN §3.3).

The reconciliation cases share one backend and gateway per store (each with a key of its own), on a
short timeout and quick workers: a lookup, a backoff, a lease run out the same way at 0.5 s as at 5 s.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from store import Store
from store.keys import scoped_key
from tests.e2e.harness import QUICK_WORKERS, Backend, Gateway, writ_gateway
from tests.eventually import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

ARGS = {"order_id": "1002", "amount": 15, "currency": "EUR", "reason": "late delivery"}
TIMEOUT_S = 0.5
"""The backend's timeout (its commit horizon twice that): what a hung refund waits before it is unknown."""


@pytest.fixture(scope="module")
def quick_gateway(
    tmp_path_factory: pytest.TempPathFactory, module_backend: Backend, module_store_url: str
) -> Iterator[Gateway]:
    workdir = tmp_path_factory.mktemp("writ")
    config = {"timeout_s": TIMEOUT_S, "overrides": {"workers": QUICK_WORKERS}}
    with writ_gateway(workdir, module_backend, module_store_url, **config) as g:
        yield g


@pytest.fixture
def backend_faults(module_backend: Backend) -> Iterator[Backend]:
    """The module's backend, its faults cleared after the case."""
    yield module_backend
    module_backend.chaos()


async def settled_status(client, tool_call_id: str) -> dict:
    status = await eventually(
        lambda: client.call_tool("writ_call_status", {"toolCallId": tool_call_id}),
        lambda s: s.structured_content["status"] != "result_unknown",
    )
    return status.structured_content


@pytest.mark.parametrize("fault", ["drop_responses", "fail_after_commit"])
async def test_a_refund_whose_answer_was_lost_becomes_unknown_then_reconciles_to_completed(
    quick_gateway: Gateway, backend_faults: Backend, module_store_url: str, fault: str
) -> None:
    gateway, backend = quick_gateway, backend_faults
    backend.chaos(**{fault: 1})
    async with gateway.client(gateway.token("alice")) as client:
        first = await client.call_tool("refund_order", ARGS, meta={"writ/idempotencyKey": f"lost-{fault}"})
        assert first.structured_content["status"] == "result_unknown", first.structured_content
        assert first.structured_content["reconciliation"] == "pending"

        settled = await settled_status(client, first.meta["writ/toolCallId"])

    assert (settled["status"], settled["verification"]) == ("completed", "confirmed_success")
    assert settled["result"]["structuredContent"]["idempotency_key"] == scoped_key(
        "acme", "alice", f"lost-{fault}"
    )
    assert len(backend.refunds(f"lost-{fault}")) == 1
    # What `writ calls show` lists, read from the store here (the CLI as a process: e2e/test_cli.py).
    with Store.open(module_store_url) as store:
        events = [e.type for e in store.events(tool_call_id=first.meta["writ/toolCallId"])]
    assert "reconciliation.started" in events and "reconciliation.resolved" in events


async def test_a_refund_the_backend_never_executed_reconciles_to_failed(
    quick_gateway: Gateway, backend_faults: Backend
) -> None:
    gateway, backend = quick_gateway, backend_faults
    backend.chaos(hang=1)
    async with gateway.client(gateway.token("alice")) as client:
        first = await client.call_tool("refund_order", ARGS, meta={"writ/idempotencyKey": "hung"})
        assert first.structured_content["status"] == "result_unknown", first.structured_content

        settled = await settled_status(client, first.meta["writ/toolCallId"])

    assert (settled["status"], settled["verification"]) == ("failed", "confirmed_failure")
    assert backend.refunds("hung") == []
