"""The registry: lookup, lifecycle, discovery once, and the fake executor other packages use."""

from __future__ import annotations

import pytest

from capabilities.contract import BackendUnavailable, CapabilityError, ConfigError, Executor, ReconcileResult
from capabilities.fake import FakeExecutor, completed, failed, fake_capability, unknown
from capabilities.registry import Registry
from tests.capabilities.conftest import invocation

pytestmark = pytest.mark.anyio


class CountingFake(FakeExecutor):
    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.discoveries = 0

    async def discover(self):  # type: ignore[no-untyped-def]
        self.discoveries += 1
        return await super().discover()


async def test_start_runs_discovery_once_and_adds_discovered_capabilities_after_static_ones() -> None:
    static = fake_capability("lookup_order", backend="shop", effect="read")
    upstream = CountingFake(capabilities=[fake_capability("fs_write", backend="files")])
    registry = Registry({"shop": FakeExecutor(), "files": upstream}, [static])

    async with registry:
        for _ in range(3):
            assert registry.get("fs_write") is not None
        assert [c.tool_name for c in registry.capabilities()] == ["lookup_order", "fs_write"]
        assert registry.by_id("fs-write") is registry.get("fs_write")
        assert upstream.started

    assert upstream.discoveries == 1
    assert upstream.closed


async def test_an_unknown_tool_name_is_none_and_an_executor_is_found_by_backend() -> None:
    shop = FakeExecutor()
    cap = fake_capability(backend="shop")
    registry = Registry({"shop": shop}, [cap])

    assert registry.get("nope") is None
    assert registry.executor(cap) is shop
    with pytest.raises(CapabilityError):
        registry.executor(fake_capability(backend="elsewhere"))


async def test_a_discovered_tool_name_clashing_with_a_static_one_fails_start_and_closes_executors() -> None:
    shop = FakeExecutor()
    files = FakeExecutor(capabilities=[fake_capability("refund_order", id="files.refund", backend="files")])
    registry = Registry({"shop": shop, "files": files}, [fake_capability(backend="shop")])

    with pytest.raises(ConfigError, match="refund_order"):
        await registry.start()
    assert shop.closed and files.closed


async def test_a_discovered_tool_taking_a_reserved_name_fails_start() -> None:
    files = FakeExecutor(capabilities=[fake_capability("writ_call_status", backend="files")])
    registry = Registry({"files": files}, reserved=frozenset({"writ_call_status"}))

    with pytest.raises(ConfigError, match="Writ's own tool"):
        await registry.start()
    assert files.closed


async def test_a_backend_that_fails_to_start_closes_the_ones_already_started() -> None:
    class Down(FakeExecutor):
        async def start(self) -> None:
            raise BackendUnavailable("down")

    first = FakeExecutor()
    registry = Registry({"first": first, "down": Down()})

    with pytest.raises(BackendUnavailable):
        await registry.start()
    assert first.closed


async def test_the_fake_executor_plays_its_script_then_the_default_and_records_invocations() -> None:
    cap = fake_capability()
    fake = FakeExecutor([unknown(), failed("http_422", "no")], default=completed({"id": 1}))
    assert isinstance(fake, Executor)

    kinds = [(await fake.execute(invocation(cap, {"n": i}))).kind for i in range(3)]

    assert kinds == ["unknown", "failed", "completed"]
    assert fake.calls_for("refund_order") == [{"n": 0}, {"n": 1}, {"n": 2}]
    last = await fake.execute(invocation(cap, external_request_id="req-1"))
    assert last.external_request_id == "req-1"
    assert last.result is not None and last.result.structured == {"id": 1}


async def test_the_fake_executor_can_raise_compute_outcomes_and_answer_reconcile() -> None:
    cap = fake_capability()
    fake = FakeExecutor(
        [RuntimeError("bug"), lambda inv: completed({"key": inv.idempotency_key})],
        reconcile_script=[ReconcileResult("succeeded")],
    )

    with pytest.raises(RuntimeError):
        await fake.execute(invocation(cap))
    computed = await fake.execute(invocation(cap, idempotency_key="k-3"))
    assert computed.result is not None and computed.result.structured == {"key": "k-3"}
    assert (await fake.reconcile(invocation(cap))).verdict == "succeeded"
    with pytest.raises(CapabilityError):
        await fake.reconcile(invocation(cap))
