"""Many claimants, one key: exactly one call is admitted to dispatch, from threads and from processes."""

from __future__ import annotations

import multiprocessing
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from store import Admission, Store
from tests.store.builders import call_request
from tests.store.workers import admit_one_key

CLAIMANTS = 20


def test_concurrent_admits_of_one_key_from_threads_admit_exactly_one(store: Store) -> None:
    barrier = threading.Barrier(CLAIMANTS)

    def claim(n: int) -> Admission:
        barrier.wait(timeout=30)
        return store.admit(call_request(tool_call_id=f"tc-{n}", idempotency_key="shared"))

    with ThreadPoolExecutor(CLAIMANTS) as pool:
        admissions = list(pool.map(claim, range(CLAIMANTS), timeout=120))

    new = [a for a in admissions if a.kind == "new"]
    assert len(new) == 1
    assert new[0].call.status == "dispatching"
    assert {a.call.tool_call_id for a in admissions} == {new[0].call.tool_call_id}
    assert [e.type for e in store.events()].count("tool_call.dispatching") == 1
    assert store.verify().ok


def test_concurrent_admits_of_many_keys_from_threads_keep_one_gapless_chain(store: Store) -> None:
    barrier = threading.Barrier(CLAIMANTS)

    def claim(n: int) -> Admission:
        barrier.wait(timeout=30)
        return store.admit(
            call_request(tool_call_id=f"tc-{n}", idempotency_key=f"k-{n}", run_id=f"run-{n % 3}")
        )

    with ThreadPoolExecutor(CLAIMANTS) as pool:
        admissions = list(pool.map(claim, range(CLAIMANTS), timeout=120))

    assert all(a.kind == "new" for a in admissions)
    seqs = [e.seq for e in store.events()]
    assert seqs == list(range(1, CLAIMANTS * 2 + 3 + 1))
    assert store.verify().ok


@pytest.mark.postgres
def test_concurrent_admits_of_one_key_from_processes_admit_exactly_one(pg_schema_url: str) -> None:
    with Store.open(pg_schema_url) as store:
        store.migrate()
        context = multiprocessing.get_context("spawn")
        processes, calls = 5, 4
        barrier = context.Barrier(processes)
        results = context.Queue()
        workers = [
            context.Process(target=admit_one_key, args=(pg_schema_url, barrier, results, n, calls))
            for n in range(processes)
        ]
        for worker in workers:
            worker.start()
        try:
            outcomes = [results.get(timeout=120) for _ in range(processes * calls)]
        finally:
            for worker in workers:
                worker.join(timeout=60)
            results.close()
            results.join_thread()

        assert [w.exitcode for w in workers] == [0] * processes
        assert not [o for o in outcomes if o[0] == "error"], outcomes
        new = [o for o in outcomes if o[0] == "new"]
        assert len(new) == 1 and new[0][2] == "dispatching"
        assert {o[1] for o in outcomes} == {new[0][1]}
        assert [e.type for e in store.events()].count("tool_call.dispatching") == 1
        assert store.verify().ok
