"""Background workers every replica runs: recovery of expired dispatch leases, reconciliation, and
pruning of budget counters and loop marks whose window ended.

No leader is assumed: each pass is a set of compare-and-set claims in the shared store, so two
replicas running the same pass at once settle each call exactly once between them.

A pass first asks the store, in one look from the event loop, which of its kinds of work are due
(store.agenda), and runs only those: an idle gateway's pass is that one statement, with no worker
thread, no pooled connection and no write. The look is a hint: the work that runs takes its locks and
re-reads as before, and the look reads the shared tables, so a call another replica left dispatching
is found within one interval.
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
from store.ports import Agenda, Pruning, Recovery

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
        agenda: Agenda,
        reconciler: Reconciler,
        clock: Callable[[], datetime],
        pruning: Pruning | None = None,
    ) -> None:
        self._store = store
        self._agenda = agenda
        self._reconciler = reconciler
        self._clock = clock
        self._pruning = pruning

    async def tick(self) -> tuple[int, int]:
        """One pass: recover expired dispatches, then try each due reconciliation once, then prune;
        each only when the store's look says some is due."""
        due = await self._agenda.due_work_async(now=self._clock())
        recovered = (
            await anyio.to_thread.run_sync(lambda: self._store.recover_expired(now=self._clock()))
            if due.expired_leases
            else []
        )
        for call in recovered:
            logger.warning(
                "call %s was left dispatching past its lease (holder %s): now result_unknown",
                call.tool_call_id,
                call.lease_owner,
            )
        # A call recovered just now is unknown and due for a lookup at once, as it was before the look.
        reconciled = await self._reconciler.run_once() if due.reconciliations or recovered else 0
        if (pruning := self._pruning) is not None and due.prunable:
            # One bounded batch a pass: a backlog (after an upgrade, a long outage) drains over passes.
            pruned = await anyio.to_thread.run_sync(lambda: pruning.prune_expired(now=self._clock()))
            if pruned:
                logger.debug("pruned %d budget counters and loop marks of ended windows", pruned)
        return len(recovered), reconciled
