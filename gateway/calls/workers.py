"""Background workers every replica runs: recovery of expired dispatch leases, reconciliation, and
pruning of budget counters and loop marks whose window ended.

No leader is assumed: each pass is a set of compare-and-set claims in the shared store, so two
replicas running the same pass at once settle each call exactly once between them.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from collections.abc import Callable
from datetime import datetime

import anyio
import anyio.to_thread

from gateway.calls.reconcile import Reconciler
from store.ports import Pruning, Recovery

logger = logging.getLogger(__name__)


def worker_id() -> str:
    """This process's name in leases: host, pid and a random suffix (pids are reused)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class Workers:
    """Lease recovery and reconciliation; `run_periodically` runs `tick`."""

    def __init__(
        self,
        *,
        store: Recovery,
        reconciler: Reconciler,
        clock: Callable[[], datetime],
        pruning: Pruning | None = None,
    ) -> None:
        self._store = store
        self._reconciler = reconciler
        self._clock = clock
        self._pruning = pruning

    async def tick(self) -> tuple[int, int]:
        """One pass: recover expired dispatches, then try each due reconciliation once."""
        recovered = await anyio.to_thread.run_sync(lambda: self._store.recover_expired(now=self._clock()))
        for call in recovered:
            logger.warning(
                "call %s was left dispatching past its lease (holder %s): now result_unknown",
                call.tool_call_id,
                call.lease_owner,
            )
        reconciled = await self._reconciler.run_once()
        if (pruning := self._pruning) is not None:
            # One bounded batch a pass: a backlog (after an upgrade, a long outage) drains over passes.
            pruned = await anyio.to_thread.run_sync(lambda: pruning.prune_expired(now=self._clock()))
            if pruned:
                logger.debug("pruned %d budget counters and loop marks of ended windows", pruned)
        return len(recovered), reconciled
