"""Code run in other processes by the concurrency tests (importable, so spawn and forkserver find it)."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

from store import Store
from store.model import Charge
from store.partitions import Partitioning, configure
from tests.store.builders import NOW, call_request


def admit_one_key(url: str, barrier: Any, results: Any, worker: int, calls: int) -> None:
    """Open a store of our own, wait for every process, then race to admit calls with one key."""
    store = Store.open(url)
    try:
        barrier.wait(timeout=60)
        for n in range(calls):
            admission = store.admit(call_request(tool_call_id=f"tc-p{worker}-{n}", idempotency_key="shared"))
            results.put((admission.kind, admission.call.tool_call_id, admission.call.status))
    except BaseException as error:  # the parent must hear of a failure instead of waiting for it
        results.put(("error", repr(error), ""))
    finally:
        store.close()


def admit_against_budget(
    url: str, barrier: Any, results: Any, worker: int, calls: int, limit: int, buckets: int = 1
) -> None:
    """Open a store of our own, wait for every process, then race to admit calls on one budget.

    With `buckets` > 1 the log is partitioned by tenant into that many buckets and each call is in a
    run of its own, so the calls append under different heads while they draw on one counter."""
    start = NOW.replace(hour=0, minute=0, second=0, microsecond=0)
    charge = Charge("daily", "shared-counter", 1_000_000, limit * 1_000_000, start, start + timedelta(days=1))
    store = Store.open(url)
    if buckets > 1:
        configure(store.engine, Partitioning("tenant", buckets))
    try:
        barrier.wait(timeout=60)
        for n in range(calls):
            run = {"run_id": f"run-p{worker}-{n}"} if buckets > 1 else {}
            request = call_request(
                tool_call_id=f"tc-p{worker}-{n}", idempotency_key=f"k-p{worker}-{n}", **run
            )
            admission = store.admit(dataclasses.replace(request, charges=(charge,)))
            results.put((admission.call.status, admission.call.reason))
    except BaseException as error:  # the parent must hear of a failure instead of waiting for it
        results.put(("error", repr(error)))
    finally:
        store.close()
