"""The Store's lease and reconciliation methods (DESIGN §3.3, §3.5), one transaction each."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime
from typing import TypeVar

from sqlalchemy import Connection

from store import commands, leasing, reconciling
from store.model import CallView

T = TypeVar("T")


class Settlement:
    """Mixed into `Store`, which provides `_write` (one write transaction), `_read` and `_producer`."""

    _producer: str

    def _write(self, now: datetime, work: Callable[[Connection], T]) -> T:
        raise NotImplementedError

    def _read(self) -> AbstractContextManager[Connection]:
        raise NotImplementedError

    def recover_expired(self, *, now: datetime, limit: int = 100) -> list[CallView]:
        """Calls left `dispatching` past their lease become `result_unknown`, with the evidence known."""
        # Every worker tick runs this. Looking first, without the log's head lock, means a replica paused
        # in the middle of a tick with nothing to recover holds no lock every other writer waits on.
        with self._read() as conn:
            if not leasing.any_expired(conn, now=now):
                return []
        return self._write(
            now, lambda conn: leasing.recover_expired(conn, now=now, producer=self._producer, limit=limit)
        )

    def due_reconciliations(self, *, now: datetime, limit: int = 20) -> list[CallView]:
        """Unknown calls waiting for a lookup (not escalated, not leased, past their backoff), and
        `failed` calls due for a re-check of their verdict."""
        with self._read() as conn:
            return reconciling.due(conn, now=now, limit=limit)

    def start_reconciliation(self, cmd: commands.StartReconciliation) -> CallView:
        """Take the reconciliation lease (`reconciliation.started`), or with method `recheck` a failed
        call's re-check lease; the view carries the new token.

        Raises:
            NotFound: no such call.
            StaleLease: another worker took it, or it was settled or escalated meanwhile (a re-check:
                contradicted, or none scheduled).
        """
        return self._write(cmd.now, lambda conn: reconciling.start(conn, cmd, producer=self._producer))

    def record_inconclusive(self, cmd: commands.RecordInconclusive) -> CallView:
        """A lookup could not tell; try again from `next_attempt_at`.

        Raises:
            NotFound, StaleLease.
        """
        return self._write(cmd.now, lambda conn: reconciling.inconclusive(conn, cmd, producer=self._producer))

    def record_recheck(self, cmd: commands.RecordRecheck) -> CallView:
        """A re-check of a `failed` verdict found no effect of the call; the next one is due at
        `next_recheck_at`, or none is.

        Raises:
            NotFound, StaleLease.
        """
        return self._write(cmd.now, lambda conn: reconciling.rechecked(conn, cmd, producer=self._producer))

    def resolve_reconciliation(self, cmd: commands.ResolveReconciliation) -> CallView:
        """The backend confirmed success (call `completed`) or failure (call `failed`; with
        `recheck_at`, looked up again from then).

        Raises:
            NotFound, StaleLease.
            StoreError: a re-check asked for a success.
        """
        return self._write(cmd.now, lambda conn: reconciling.resolve(conn, cmd, producer=self._producer))

    def escalate_reconciliation(self, cmd: commands.EscalateReconciliation) -> CallView:
        """Give up looking: the call waits for a human (`writ calls resolve`).

        Raises:
            NotFound, StaleLease.
        """
        return self._write(cmd.now, lambda conn: reconciling.escalate(conn, cmd, producer=self._producer))

    def redispatch(self, cmd: commands.Redispatch) -> CallView:
        """Re-send the same key (backends that deduplicate on it only): `dispatching`, next attempt.

        Raises:
            NotFound, StaleLease.
        """
        return self._write(cmd.now, lambda conn: reconciling.redispatch(conn, cmd, producer=self._producer))

    def resolve_manually(self, cmd: commands.ResolveManually) -> CallView:
        """A person settles an unknown or contradicted outcome with evidence, or contradicts a settled
        one (`reconciliation.contradicted`: the verdict stands, the call is escalated); recorded with who.

        Raises:
            NotFound: no such call (in `tenant`).
            StaleLease: nothing to settle and the person agrees with the settled verdict.
            StoreError: empty evidence or name.
        """
        return self._write(
            cmd.now, lambda conn: reconciling.resolve_by_human(conn, cmd, producer=self._producer)
        )

    def record_contradiction(self, cmd: commands.RecordContradiction) -> CallView | None:
        """Record evidence against a settled verdict (`reconciliation.contradicted`) and escalate the
        call; None when the call is not settled or the evidence agrees (nothing recorded).

        Raises:
            NotFound: no such call.
            StaleLease: `cmd.token` is not the current re-check lease of a standing failure.
        """
        return self._write(cmd.now, lambda conn: reconciling.contradict(conn, cmd, producer=self._producer))
