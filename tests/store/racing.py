"""Many writers at once against one store: threads released together, or processes of their own."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from tests.forking import forkserver

_T = TypeVar("_T")
_A = TypeVar("_A")


def at_once(work: Callable[[_A], _T], items: Iterable[_A]) -> list[_T]:
    """`work(item)` for every item, each in a thread of its own, all released by one barrier."""
    items = list(items)
    barrier = threading.Barrier(len(items))

    def run(item: _A) -> _T:
        barrier.wait(timeout=30)
        return work(item)

    with ThreadPoolExecutor(len(items)) as pool:
        return list(pool.map(run, items, timeout=120))


def in_processes(target: Callable[..., None], url: str, processes: int, calls: int, *args: Any) -> list[Any]:
    """What `processes` workers put on their queue, `calls` each: `target(url, barrier, results, n, calls,
    *args)` in processes of their own, with their own connections (tests/store/workers.py), forked from
    a server that imported the store once instead of interpreters importing it side by side."""
    context = forkserver()
    barrier = context.Barrier(processes)
    results = context.Queue()
    workers = [
        context.Process(target=target, args=(url, barrier, results, n, calls, *args))
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
    return outcomes
