"""Background workers every replica runs: recovery of expired dispatch leases, then reconciliation.

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
from store.ports import Recovery

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
    ) -> None:
        self._store = store
        self._reconciler = reconciler
        self._clock = clock

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
        return len(recovered), reconciled
