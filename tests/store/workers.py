"""Code run in other processes by the concurrency tests (importable, so spawn and forkserver find it)."""

from __future__ import annotations

from typing import Any

from store import Store
from tests.store.builders import call_request


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
