"""Keys as a backend gets them: each principal's own, so one principal's key never answers for another's.

A deduplicating backend (acme-payments `--dedupe`, as Stripe's API is) and `writ serve` as processes,
the official MCP client, one gateway per store for the module. Inside Writ a key is the principal's
own; before keys were scoped, the backend held every principal's in one space and answered a second
principal's refund under the same key with the first one's, a refund that never happened.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx2
import pytest

from store.keys import scoped_key
from tests.e2e.harness import QUICK_WORKERS, Backend, Gateway, acme_backend, writ_gateway
from tests.eventually import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


@pytest.fixture(scope="module")
def deduping_backend(tmp_path_factory: pytest.TempPathFactory, module_store_url: str) -> Iterator[Backend]:
    with acme_backend(tmp_path_factory.mktemp("acme"), dedupe=True) as b:
        yield b


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, deduping_backend: Backend, module_store_url: str
) -> Iterator[Gateway]:
    config: dict[str, Any] = {
        "capabilities": {"refund-order": {"dedupes_on_key": True}},
        "overrides": {"workers": QUICK_WORKERS},
    }
    with writ_gateway(tmp_path_factory.mktemp("writ"), deduping_backend, module_store_url, **config) as g:
        yield g


@pytest.fixture
def backend(deduping_backend: Backend) -> Iterator[Backend]:
    yield deduping_backend
    deduping_backend.chaos()


# Order 1002 (5000 EUR) takes every case's refunds.
def refund(amount: float) -> dict[str, Any]:
    return {"order_id": "1002", "amount": amount, "currency": "EUR", "reason": f"refund of {amount}"}


PRINCIPALS = [("acme", "alice"), ("acme", "bob"), ("globex", "alice")]
"""Two subjects of one tenant, and the same subject name in another tenant."""


async def test_principals_sending_one_key_to_a_deduplicating_backend_each_get_their_own_refund(
    gateway: Gateway, backend: Backend
) -> None:
    answers = {}
    for n, (tenant, subject) in enumerate(PRINCIPALS):
        async with gateway.client(gateway.token(subject, tenant=tenant)) as client:
            answers[tenant, subject] = await client.call_tool(
                "refund_order", refund(11 + n), meta={"writ/idempotencyKey": "same-key"}
            )

    # Three refunds, each told to its own principal: none answered with another's.
    assert {answer.meta["writ/status"] for answer in answers.values()} == {"completed"}
    assert [answer.structured_content["amount"] for answer in answers.values()] == [11, 12, 13]
    assert len({answer.structured_content["refund_id"] for answer in answers.values()}) == 3
    assert len(backend.refunds("same-key")) == 3
    for tenant, subject in PRINCIPALS:
        answer = answers[tenant, subject]
        assert answer.meta["writ/idempotencyKey"] == "same-key"  # the client is told its own key
        got = answer.structured_content
        sent = scoped_key(tenant, subject, "same-key")
        assert got["idempotency_key"] == sent
        assert [r["refund_id"] for r in backend.refunds_sent(sent)] == [got["refund_id"]]
        # What an operator matches at the backend, as Writ shows it.
        token = gateway.token(subject, tenant=tenant)
        shown = httpx2.get(
            f"{gateway.url}/api/calls/{answer.meta['writ/toolCallId']}",
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
        ).json()
        assert (shown["idempotencyKey"], shown["backendKey"]) == ("same-key", sent)


async def test_an_unknown_refund_is_re_sent_under_its_principals_key_and_settled_with_its_own_refund(
    gateway: Gateway, backend: Backend
) -> None:
    async with gateway.client(gateway.token("bob")) as client:
        bobs = await client.call_tool("refund_order", refund(7), meta={"writ/idempotencyKey": "lost"})
    assert bobs.meta["writ/status"] == "completed"
    backend.chaos(drop_responses=1)
    async with gateway.client(gateway.token("alice")) as client:
        first = await client.call_tool("refund_order", refund(8), meta={"writ/idempotencyKey": "lost"})
        assert first.structured_content["status"] == "result_unknown", first.structured_content
        status = await eventually(
            lambda: client.call_tool("writ_call_status", {"toolCallId": first.meta["writ/toolCallId"]}),
            lambda s: s.structured_content["status"] in ("completed", "failed"),  # re-sent, answered
        )

    settled = status.structured_content
    assert settled["status"] == "completed"  # the re-send's own answer, not a lookup's
    own = settled["result"]["structuredContent"]
    assert own["amount"] == 8 and own["refund_id"] != bobs.structured_content["refund_id"]
    alices = scoped_key("acme", "alice", "lost")
    assert own["idempotency_key"] == alices
    # Sent twice under alice's key, executed once: the backend answered the re-send with her refund.
    assert [r["refund_id"] for r in backend.refunds_sent(alices)] == [own["refund_id"]]
    assert len(backend.refunds("lost")) == 2
    with gateway.store() as store:
        dispatches = [
            e.payload["idempotency_key"]
            for e in store.events(tool_call_id=first.meta["writ/toolCallId"])
            if e.type == "tool_call.dispatching"
        ]
        assert dispatches == [alices, alices]
        assert store.verify().ok
