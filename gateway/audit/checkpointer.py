"""The periodic checkpointer: signs the log's head when it moved enough or long enough ago, never idle.

It runs on the workers' loop (`run_periodically`) in every replica; each writes its own file, so
replicas never interleave, and more checkpoints only narrow the unanchored tail.
"""

from __future__ import annotations

import logging
from datetime import datetime
from pathlib import Path

import anyio

from gateway.audit.checkpoints import (
    Checkpoint,
    CheckpointSigner,
    newest_seq,
    read_all,
    trusted_keys,
    write_checkpoint,
)
from gateway.clock import Clock
from store.ports import AuditLog

logger = logging.getLogger(__name__)


class Checkpointer:
    """Writes a checkpoint when `every_events` events were appended or `every_s` passed since the last."""

    def __init__(
        self,
        *,
        log: AuditLog,
        signer: CheckpointSigner,
        directory: str | Path,
        trusted: str | Path,
        clock: Clock,
        every_events: int,
        every_s: float,
    ) -> None:
        self._log, self._signer, self._directory, self._trusted = log, signer, directory, trusted
        self._clock, self._every_events, self._every_s = clock, every_events, every_s
        self._last_seq: int | None = None  # unknown until the first pass reads the directory
        self._last_at: datetime | None = None

    async def tick(self) -> Checkpoint | None:
        """One pass: a checkpoint if one is due, else nothing."""
        return await anyio.to_thread.run_sync(self.pass_once)

    def pass_once(self) -> Checkpoint | None:
        """`tick`, on the calling thread (the store and the files are blocking)."""
        seq, _ = self._log.log_head()
        keys = trusted_keys(self._trusted)
        if self._last_seq is None:
            found = read_all([self._directory], keys) if Path(self._directory).is_dir() else []
            self._last_seq = newest_seq(found, self._log.event_hashes(0, 1)[0]) if seq else 0
        now = self._clock()
        if seq == 0 or seq == self._last_seq:
            return None  # idle: nothing new to vouch for
        waited = self._last_at is None or (now - self._last_at).total_seconds() >= self._every_s
        if seq - self._last_seq < self._every_events and not waited:
            return None
        made, path = write_checkpoint(
            self._log, self._signer, self._directory, keys, now, previous=self._last_seq
        )
        self._last_seq, self._last_at = made.anchor.seq, now
        logger.info("checkpoint at seq %d (kid %s) appended to %s", made.anchor.seq, made.kid, path)
        return made
