"""Processes of their own for tests that race them, forked from one server per test process.

A spawned process imports what it runs from source: about 2 s of CPU for the gateway's modules, paid by
every process of every race. The forkserver imports them once (per test process, for the rest of its
life) and forks each racer from there. Its preload is one list for the whole suite because the server
starts once: a module left out would be imported again in every child.
"""

from __future__ import annotations

import multiprocessing
from multiprocessing.context import ForkServerContext

PRELOAD = ["tests.store.workers", "tests.gateway.calls.approval_workers", "tests.gateway.secret_racers"]
"""The modules whose functions run in forked processes (importable, so the children find them)."""


def forkserver() -> ForkServerContext:
    """The forkserver context, with the suite's preload."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context
