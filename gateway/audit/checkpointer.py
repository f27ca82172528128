"""The periodic checkpointer: signs the log's head when it moved enough or long enough ago, never idle.

It runs on the workers' loop (`run_periodically`) in every replica; each writes its own file, so
replicas never interleave, and more checkpoints only narrow the unanchored tail. With a webhook
configured (`audit.checkpoints.webhook`), each checkpoint is also queued in the store's outbox and
POSTed, signed and retried like an approval notification, to a receiver the database's operators do
not control; the outbox is in the database they do control, so the receiver should alert when
checkpoints stop arriving (`writ.audit.checkpoint.age` says the same on this side).

A pass first looks, from the event loop, at how far the log has grown (`appended_async`, one statement
on the loop's own connection) and goes to a worker thread, the directory and the trusted keys file only
when that says a checkpoint may be due; `pass_once` then reads the heads again and decides. The trusted
keys are read again only when their file changed.
"""

from __future__ import annotations

import hashlib
import logging
import os
from datetime import datetime
from pathlib import Path
from typing import Protocol

import anyio
from joserfc.jwk import KeySet

from gateway.audit.checkpoints import (
    Checkpoint,
    CheckpointSigner,
    log_identity,
    newest_heads,
    read_all,
    trusted_keys,
    write_checkpoint,
)
from gateway.clock import Clock
from store.commands import EnqueueOutbox
from store.events import GENESIS_HASH, parse_ts
from store.ports import AuditLog
from store.queues import TOPIC_CHECKPOINT


class CheckpointOutbox(Protocol):
    """Where a checkpoint is queued for its webhook (the store's outbox)."""

    def enqueue_outbox(self, cmd: EnqueueOutbox) -> bool: ...


def announce(outbox: CheckpointOutbox, made: Checkpoint, now: datetime) -> bool:
    """Queue `made` for the checkpoints' webhook, one message a line (a checkpoint of several pages
    sends each, with `page` [k, n]); False if every line was queued before (same JWS, same id)."""
    queued = False
    for number, line in enumerate(made.lines, start=1):
        digest = hashlib.sha256(line.encode("ascii")).hexdigest()[:40]
        payload = {
            "type": TOPIC_CHECKPOINT,
            "checkpoint": line,
            "seq": made.anchor.seq,
            "hash": made.anchor.hash,
            "log": made.anchor.log_id,
            "kid": made.kid,
            "at": made.at,
            "writer": made.writer,
        }
        if len(made.lines) > 1:
            payload["page"] = [number, len(made.lines)]
        queued |= outbox.enqueue_outbox(EnqueueOutbox(f"ckpt_{digest}", TOPIC_CHECKPOINT, payload, now))
    return queued


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
        outbox: CheckpointOutbox | None = None,
    ) -> None:
        self._outbox = outbox
        self._head_seq = 0
        self._anchored_at: datetime | None = None
        """When the newest checkpoint was made (by this replica, or found in the directory)."""
        self._log, self._signer, self._directory, self._trusted = log, signer, directory, trusted
        self._clock, self._every_events, self._every_s = clock, every_events, every_s
        self._previous: dict[str, int] | None = None  # unknown until the first pass reads the directory
        """The newest seq a checkpoint vouches for in each partition."""
        self._last_total = 0
        """Events of every partition the newest checkpoint vouches for (its seq alone with one)."""
        self._last_at: datetime | None = None
        self._keys: tuple[tuple[int, int, int], KeySet] | None = None
        """The trusted keys as last read, with the file's (inode, size, mtime) then."""

    async def tick(self) -> Checkpoint | None:
        """One pass: a checkpoint if one is due, else nothing."""
        if self._previous is not None:
            total = await self._log.appended_async()
            self._head_seq = total
            if not self._due(total, self._clock()):
                return None  # known cheaply, on the loop: no thread, no files
        return await anyio.to_thread.run_sync(self.pass_once)

    def _due(self, total: int, now: datetime) -> bool:
        """Whether a log of `total` events calls for a checkpoint now (after the first pass)."""
        if total == 0 or total == self._last_total:
            return False  # idle: nothing new to vouch for
        waited = self._last_at is None or (now - self._last_at).total_seconds() >= self._every_s
        return total - self._last_total >= self._every_events or waited

    def _trusted_keys(self) -> KeySet:
        """The trusted keys, read again only when their file changed (another inode, size or mtime)."""
        try:
            stat = os.stat(self._trusted)
        except OSError:
            return trusted_keys(self._trusted)  # says what is wrong with the file
        stamp = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        if self._keys is None or self._keys[0] != stamp:
            self._keys = (stamp, trusted_keys(self._trusted))
        return self._keys[1]

    def pass_once(self) -> Checkpoint | None:
        """`tick`, on the calling thread (the store and the files are blocking)."""
        heads = self._log.partition_heads()
        # Progress counts every partition's events: a partitioned log grows mostly outside "".
        total = sum(at for at, _ in heads.values())
        self._head_seq = total
        keys = self._trusted_keys()
        if self._previous is None:
            found = read_all([self._directory], keys) if Path(self._directory).is_dir() else []
            if total:
                log_id = log_identity(self._log, heads.get("", (0, ""))[0], lambda: found)
                self._previous = newest_heads(found, log_id)
                self._anchored_at = _newest_time(found, log_id)
            else:
                self._previous = {}
            self._last_total = sum(self._previous.values())
        now = self._clock()
        if not self._due(total, now):
            return None
        made, path = write_checkpoint(
            self._log, self._signer, self._directory, keys, now, previous=self._previous
        )
        self._previous = {claim.partition: claim.seq for claim in made.anchor.claims()}
        self._last_total, self._last_at = sum(self._previous.values()), now
        self._anchored_at = now
        logger.info(
            "checkpoint at seq %d (kid %s, %d lines) appended to %s",
            made.anchor.seq,
            made.kid,
            len(made.lines),
            path,
        )
        if self._outbox is not None:
            announce(self._outbox, made, now)
        return made

    def age_s(self) -> float | None:
        """Seconds the newest events have waited unanchored: since the newest checkpoint this replica
        wrote or found, 0 while the log has not moved past it; None before the first pass or checkpoint.
        """
        if self._previous is None:
            return None
        if self._head_seq <= self._last_total:
            return 0.0
        if self._anchored_at is None:
            return None
        return max((self._clock() - self._anchored_at).total_seconds(), 0.0)


def _newest_time(found: list[Checkpoint], log_id: str) -> datetime | None:
    times = [c.at for c in found if c.anchor.log_id in (log_id, GENESIS_HASH)]
    return parse_ts(max(times)) if times else None
