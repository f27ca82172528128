"""Many processes decide and resume one approval on PostgreSQL: one decision wins, one execution."""

from __future__ import annotations

import anyio
import pytest

from gateway.calls.pipeline import CallInput
from policy.model import Principal
from tests.forking import forkserver
from tests.gateway.calls.approval_workers import decide_and_resume, parts
from tests.store import conftest as store_fixtures

pg_schema_url = store_fixtures.pg_schema_url  # a throwaway PostgreSQL schema per test

PROCESSES = 6


@pytest.mark.postgres
def test_concurrent_decisions_from_several_processes_yield_one_execution(pg_schema_url: str) -> None:
    store, _executor, pipeline, _resumer, _decisions = parts(pg_schema_url, "requester")
    try:
        store.migrate()
        alice = Principal("alice", tenant="acme", roles=frozenset({"agent"}))

        async def request() -> str:
            report = await pipeline.call(
                CallInput(alice, "refund_order", {"order_id": "1001", "amount": 250}, idempotency_key="k")
            )
            assert report.call.status == "approval_pending" and report.call.approval_id
            return report.call.approval_id

        approval_id = anyio.run(request)
        context = forkserver()  # processes of their own, forked from one that imported Writ once
        barrier = context.Barrier(PROCESSES)
        results = context.Queue()
        workers = [
            context.Process(target=decide_and_resume, args=(pg_schema_url, approval_id, barrier, results, n))
            for n in range(PROCESSES)
        ]
        for worker in workers:
            worker.start()
        try:
            outcomes = [results.get(timeout=120) for _ in range(PROCESSES)]
        finally:
            for worker in workers:
                worker.join(timeout=60)
            results.close()
            results.join_thread()

        assert [w.exitcode for w in workers] == [0] * PROCESSES
        assert not [o for o in outcomes if o[0] == "error"], outcomes
        assert sorted(o[0] for o in outcomes) == ["already_decided"] * (PROCESSES - 1) + ["approved"]
        assert sum(o[1] for o in outcomes) == 1  # one execution among all processes
        types = [e.type for e in store.events()]
        assert types.count("approval.granted") == 1
        assert types.count("tool_call.dispatching") == 1 and types.count("tool_call.completed") == 1
        assert store.verify().ok
    finally:
        store.close()
