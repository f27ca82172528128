"""One client cannot flood the permanent log: bounded refusals, bounded arguments, rate limits.

The official MCP client against real `writ serve` processes, on SQLite and PostgreSQL. The cases share
one backend per store and two gateways on it, the standard one and one with tight rate limits (on a
store of its own); each case has principals and keys of its own and compares what was recorded and
refunded with what it was before the case.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from store import Store
from tests.e2e.harness import Backend, Gateway, acme_backend, writ_gateway
from tests.postgres import fresh_schema

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


def refund(amount: object = 20, reason: str = "damaged in transit") -> dict[str, object]:
    return {"order_id": "1001", "amount": amount, "currency": "EUR", "reason": reason}


def logged_bytes(store_url: str) -> int:
    with Store.open(store_url) as store:
        return sum(len(json.dumps(e.payload, ensure_ascii=False)) for e in store.events())


def recorded_calls(store_url: str) -> int:
    with Store.open(store_url) as store:
        return sum(e.type == "tool_call.requested" for e in store.events())


@pytest.fixture
def gateway(module_gateway: Gateway) -> Gateway:
    return module_gateway


@pytest.fixture
def backend(module_backend: Backend) -> Backend:
    return module_backend


@pytest.fixture
def store_url(module_store_url: str) -> str:
    return module_store_url


async def test_a_flood_of_schema_invalid_calls_grows_the_log_by_a_bounded_amount_per_call(
    gateway: Gateway, backend: Backend, store_url: str
) -> None:
    # 200 kB of invalid value per call, under the size limit: the log kept every one of them whole.
    refunds = backend.refunds()
    before = logged_bytes(store_url)
    async with gateway.client(gateway.token("mallory")) as client:
        for n in range(5):
            bad = await client.call_tool("refund_order", refund(amount="9" * 200_000 + str(n)))
            assert bad.is_error and bad.structured_content["reason"] == "invalid_arguments"
    grown = logged_bytes(store_url) - before
    assert grown < 5 * 12_000, grown
    with Store.open(store_url) as store:
        call = store.get_call(bad.structured_content["toolCallId"])
    assert call is not None and call.arguments["writ/refusedArguments"]["bytes"] > 200_000
    assert backend.refunds() == refunds


async def test_arguments_over_the_size_limit_are_refused_with_the_limit_named(
    gateway: Gateway, backend: Backend, store_url: str
) -> None:
    refunds = backend.refunds()
    async with gateway.client(gateway.token("oscar")) as client:
        big = await client.call_tool("refund_order", refund(reason="r" * 300_000))
    assert big.is_error is True
    body = big.structured_content
    assert body["status"] == "denied" and body["reason"] == "invalid_arguments"
    assert any("over the limit of 262144 bytes" in e for e in body["errors"]), body["errors"]
    assert backend.refunds() == refunds
    with Store.open(store_url) as store:
        recorded = store.events(tool_call_id=body["toolCallId"])
    assert [e.type for e in recorded] == ["tool_call.requested", "tool_call.denied"]
    assert all(len(json.dumps(e.payload)) < 12_000 for e in recorded)


@pytest.fixture(scope="module")
def limited_store_url(
    module_store_url: str, tmp_path_factory: pytest.TempPathFactory, postgres_url: str
) -> Iterator[str]:
    """A store of the limited gateway's own, of the module's kind."""
    if module_store_url.startswith("sqlite"):
        yield f"sqlite:///{tmp_path_factory.mktemp('limited') / 'writ.db'}"
        return
    with fresh_schema(postgres_url, "writ_e2e") as url:
        yield url


@pytest.fixture(scope="module")
def limited(
    tmp_path_factory: pytest.TempPathFactory, module_backend: Backend, limited_store_url: str
) -> Iterator[Gateway]:
    limits = {
        "per_s": 0.05,
        "burst": 3,
        "tenants": {"globex": {"per_s": 0.05, "burst": 1}},
        "capabilities": {"refund_order": {"per_s": 0.05, "burst": 1}},
    }
    workdir = tmp_path_factory.mktemp("limited")
    with writ_gateway(workdir, module_backend, limited_store_url, overrides={"rate_limits": limits}) as g:
        yield g


async def test_past_its_burst_a_principal_is_told_to_wait_and_nothing_is_recorded(
    limited: Gateway, limited_store_url: str
) -> None:
    store_url = limited_store_url
    async with limited.client(limited.token("alice")) as client:
        passed = [await client.call_tool("lookup_order", {"order_id": "1001"}) for _ in range(3)]
        before = recorded_calls(store_url)
        refused = await client.call_tool("lookup_order", {"order_id": "1001"})
    assert all(not r.is_error and "writ/toolCallId" in r.meta for r in passed)
    assert refused.is_error is False
    body = refused.structured_content
    assert (body["status"], body["reason"]) == ("denied", "rate_limited")
    assert 0 < body["retryAfterS"] <= 20.001
    assert "Wait" in body["next"] and "toolCallId" not in body
    assert recorded_calls(store_url) == before  # a refused flood costs the log nothing
    # Another principal has buckets of its own.
    async with limited.client(limited.token("bob")) as client:
        assert not (await client.call_tool("lookup_order", {"order_id": "1001"})).is_error


async def test_a_capability_and_a_tenant_can_have_tighter_limits(limited: Gateway, backend: Backend) -> None:
    refunds = len(backend.refunds())
    async with limited.client(limited.token("carol")) as client:
        first = await client.call_tool("refund_order", refund(), meta={"writ/idempotencyKey": "r1"})
        second = await client.call_tool("refund_order", refund(21), meta={"writ/idempotencyKey": "r2"})
        # The refused refund took nothing from carol's own bucket: two more calls fit in it.
        reads = [await client.call_tool("lookup_order", {"order_id": "1001"}) for _ in range(2)]
    assert first.structured_content["status"] == "succeeded"
    assert second.structured_content["reason"] == "rate_limited"
    assert all(not r.is_error and r.structured_content.get("reason") != "rate_limited" for r in reads)
    assert len(backend.refunds()) == refunds + 1
    async with limited.client(limited.token("gus", tenant="globex")) as client:
        outcomes = [await client.call_tool("lookup_order", {"order_id": "1001"}) for _ in range(2)]
    assert [(o.structured_content or {}).get("reason") for o in outcomes][1] == "rate_limited"


@pytest.mark.postgres
async def test_two_replicas_on_one_postgresql_database_share_a_principals_buckets(
    tmp_path: Path, postgres_url: str
) -> None:
    limits = {"per_s": 0.01, "burst": 6}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with (
        acme_backend(tmp_path) as backend,
        fresh_schema(postgres_url, "writ_e2e") as url,
        writ_gateway(tmp_path / "a", backend, url, overrides={"rate_limits": limits}) as one,
        writ_gateway(tmp_path / "b", backend, url, overrides={"rate_limits": limits}) as two,
    ):
        answers: list[Any] = []

        async def hammer(replica: Gateway) -> None:
            async with replica.client(replica.token("alice")) as client:
                for _ in range(8):
                    key = {"writ/idempotencyKey": uuid.uuid4().hex}  # eight calls, never one joined
                    answers.append(await client.call_tool("lookup_order", {"order_id": "1001"}, meta=key))

        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                for replica in (one, two, one, two):
                    tg.start_soon(hammer, replica)
        passed = [a for a in answers if (a.structured_content or {}).get("reason") != "rate_limited"]
        assert len(answers) == 32 and len(passed) == 6
        assert recorded_calls(url) == 6
