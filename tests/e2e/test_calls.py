"""A guarded, recorded, exactly-once tool call from the official MCP client to a real backend, both eras.

Against the whole gateway served in this process, one per store for the module (`inproc_gateway`); and
the either-era call once more against `writ serve` and the backend as processes (e2e), so each protocol
era is heard through a real gateway process too.
"""

from __future__ import annotations

import uuid

import anyio
import pytest

from store.keys import scoped_key
from tests.e2e.harness import Backend, Gateway
from tests.eventually import eventually

pytestmark = pytest.mark.anyio

ERAS = ["legacy", "2026-07-28"]


# The cases share one gateway and backend per store (conftest's inproc_gateway): each uses keys and
# principals of its own, and counts refunds against what the backend held before it.
@pytest.fixture
def gateway(inproc_gateway: Gateway) -> Gateway:
    return inproc_gateway


@pytest.fixture
def backend(inproc_backend: Backend) -> Backend:
    return inproc_backend


def fresh(name: str) -> str:
    """A key or subject no other case uses."""
    return f"{name}-{uuid.uuid4().hex[:8]}"


# Order 1002 (5000 EUR) can take every case's small refunds; 1001 (120 EUR) would run out.
def refund_args(amount: float = 20, order: str = "1002", currency: str = "EUR") -> dict[str, object]:
    return {"order_id": order, "amount": amount, "currency": currency, "reason": "damaged in transit"}


@pytest.mark.parametrize("mode", ERAS)
async def test_a_client_of_either_era_lists_tools_and_makes_a_read_and_a_write_call(
    gateway: Gateway, backend: Backend, mode: str
) -> None:
    await read_and_write(gateway, backend, mode)


@pytest.mark.e2e
@pytest.mark.parametrize("mode", ERAS)
async def test_a_client_of_either_era_is_served_by_a_writ_serve_process(
    module_sqlite_gateway: Gateway, module_sqlite_backend: Backend, mode: str
) -> None:
    # The transport and each era through the real process and its start-up; the store is not the point.
    await read_and_write(module_sqlite_gateway, module_sqlite_backend, mode)


async def read_and_write(gateway: Gateway, backend: Backend, mode: str) -> None:
    key = fresh(f"k-{mode}")
    async with gateway.client(gateway.token("alice"), mode=mode) as client:
        assert client.protocol_version == ("2025-11-25" if mode == "legacy" else "2026-07-28")
        names = {tool.name for tool in (await client.list_tools()).tools}
        assert names == {"lookup_order", "refund_order", "writ_call_status"}

        read = await client.call_tool("lookup_order", {"order_id": "1001"})
        assert read.is_error is False
        assert read.structured_content["order_id"] == "1001"
        assert read.meta["writ/toolCallId"].startswith("tc_")

        write = await client.call_tool("refund_order", refund_args(), meta={"writ/idempotencyKey": key})
        assert write.is_error is False, write
        assert write.structured_content["status"] == "succeeded"
        assert write.meta["writ/status"] == "completed"
    # The backend got the key scoped to alice, and holds her refund under it.
    assert [r["idempotency_key"] for r in backend.refunds(key)] == [scoped_key("acme", "alice", key)]


@pytest.mark.parametrize("mode", ERAS)
async def test_the_same_write_resent_with_the_same_key_has_one_effect_and_one_tool_call_id(
    gateway: Gateway, backend: Backend, mode: str
) -> None:
    same = fresh("same")
    async with gateway.client(gateway.token("alice"), mode=mode) as client:
        first = await client.call_tool("refund_order", refund_args(), meta={"writ/idempotencyKey": same})
        again = await client.call_tool("refund_order", refund_args(), meta={"writ/idempotencyKey": same})
    assert first.meta["writ/toolCallId"] == again.meta["writ/toolCallId"]
    assert again.structured_content == first.structured_content
    assert len(backend.refunds(same)) == 1


async def test_the_same_arguments_with_a_new_key_are_a_legitimate_second_effect(
    gateway: Gateway, backend: Backend
) -> None:
    a, b = fresh("a"), fresh("b")
    async with gateway.client(gateway.token("alice")) as client:
        one = await client.call_tool("refund_order", refund_args(), meta={"writ/idempotencyKey": a})
        two = await client.call_tool("refund_order", refund_args(), meta={"writ/idempotencyKey": b})
    assert one.meta["writ/toolCallId"] != two.meta["writ/toolCallId"]
    assert len(backend.refunds(a)) == 1 and len(backend.refunds(b)) == 1


async def test_without_a_key_an_identical_call_joins_the_earlier_one_instead_of_repeating_it(
    gateway: Gateway, backend: Backend
) -> None:
    before = len(backend.refunds())
    async with gateway.client(gateway.token(fresh("alice"))) as client:
        first = await client.call_tool("refund_order", refund_args(12))
        again = await client.call_tool("refund_order", refund_args(12))
    assert first.meta["writ/toolCallId"] == again.meta["writ/toolCallId"]
    assert len(backend.refunds(first.meta["writ/idempotencyKey"])) == 1
    assert len(backend.refunds()) == before + 1


async def test_an_amount_resent_as_a_float_is_the_same_call_not_a_second_refund(
    gateway: Gateway, backend: Backend
) -> None:
    # 13 and 13.0 are one JSON number: the resend hashed differently, so it got a new derived key and
    # a second refund (or, under the client's own key, idempotency_conflict).
    before, k14 = len(backend.refunds()), fresh("k14")
    async with gateway.client(gateway.token(fresh("alice"))) as client:
        first = await client.call_tool("refund_order", refund_args(13))
        again = await client.call_tool("refund_order", refund_args(13.0))
        keyed = await client.call_tool("refund_order", refund_args(14), meta={"writ/idempotencyKey": k14})
        rekeyed = await client.call_tool("refund_order", refund_args(14.0), meta={"writ/idempotencyKey": k14})
    assert first.meta["writ/toolCallId"] == again.meta["writ/toolCallId"]
    assert keyed.meta["writ/toolCallId"] == rekeyed.meta["writ/toolCallId"]
    assert rekeyed.meta["writ/status"] == "completed"
    assert len(backend.refunds()) == before + 2


async def test_twenty_concurrent_calls_with_one_key_dispatch_exactly_once(
    gateway: Gateway, backend: Backend
) -> None:
    token = gateway.token("alice")
    ids: list[str] = []
    key = f"burst-{uuid.uuid4().hex[:8]}"

    async def one() -> None:
        async with gateway.client(token, mode="2026-07-28") as client:
            result = await client.call_tool(
                "refund_order", refund_args(15), meta={"writ/idempotencyKey": key}
            )
            ids.append(result.meta["writ/toolCallId"])

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for _ in range(20):
                tg.start_soon(one)
    assert len(ids) == 20 and len(set(ids)) == 1
    assert len(backend.refunds(key)) == 1


async def test_a_backend_that_times_out_after_receiving_the_call_gives_result_unknown_and_no_retry(
    gateway: Gateway, backend: Backend
) -> None:
    slow = fresh("slow")
    backend.chaos(delay_ms=4000)  # longer than the gateway's 2 s backend timeout
    try:
        async with gateway.client(gateway.token("alice")) as client:
            result = await client.call_tool(
                "refund_order", refund_args(11), meta={"writ/idempotencyKey": slow}
            )
            assert result.is_error is False
            assert result.structured_content["status"] == "result_unknown"
            assert result.structured_content["reconciliation"] == "pending"
            again = await client.call_tool(
                "refund_order", refund_args(11), meta={"writ/idempotencyKey": slow}
            )
            assert again.meta["writ/toolCallId"] == result.meta["writ/toolCallId"]
            # Reconciliation may already have found the refund; it never sends it again.
            assert again.meta["writ/status"] in ("result_unknown", "completed")
    finally:
        backend.chaos(delay_ms=0)  # the next case shares this backend
    await eventually(lambda: backend.refunds(slow))
    assert len(backend.refunds(slow)) == 1  # it did act, once; Writ did not send it again
