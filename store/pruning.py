"""Pruning budget counters and loop marks whose window ended: they are never read again.

A counter's key and a mark's pattern name their window, so admission only ever reads the current
window's rows; those of ended windows would only grow the tables. Every replica's periodic workers
delete them in bounded batches, `GRACE` after the window ended (a replica whose clock lags may still
be charging it). Deleting a row that is already gone deletes nothing, so replicas pruning at once
need no lock; and no event is written, so the head lock is not taken. Counters of a run's lifetime
(no window) and marks recorded before windows were kept on them stay.

The log keeps every charge and mark: `writ store rebuild` brings them back, and `writ audit verify`
(store.replay) accepts a row of an ended window that the live table no longer has.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, Connection, Table, delete, or_, select, tuple_

from store.schema import budget_counters, loop_marks

GRACE = timedelta(minutes=10)
"""How long after its window ended a row is kept: more than replicas' clocks may disagree by."""
BATCH = 500
"""Rows deleted per table and transaction: a pass never holds many locks, nor for long."""

T = TypeVar("T")


def ended(table: Table, before: Any) -> ColumnElement[bool]:
    """Rows of `table` (a counter or mark table) whose window ended before `before` (a datetime, or a
    bound parameter); a row of no window (a run's lifetime) never ends."""
    window_ended: ColumnElement[bool] = table.c.resets_at < before
    return window_ended


def prune(conn: Connection, table: Table, before: datetime, limit: int) -> int:
    """Delete up to `limit` rows of `table` (a counter or mark table) whose window ended before `before`."""
    key = list(table.primary_key.columns)
    due = select(*key).where(ended(table, before)).order_by(table.c.resets_at).limit(limit)
    if len(key) == 1:
        statement = delete(table).where(key[0].in_(due.scalar_subquery()))
    else:
        # SQLite and PostgreSQL both take a row value IN a subquery.
        statement = delete(table).where(tuple_(*key).in_(due))
    return conn.execute(statement).rowcount or 0


def some_ended(before: Any) -> ColumnElement[bool]:
    """Whether some counter or mark's window ended before `before` (a datetime, or a bound parameter)."""
    return or_(
        select(budget_counters.c.resets_at).where(ended(budget_counters, before)).exists(),
        select(loop_marks.c.resets_at).where(ended(loop_marks, before)).exists(),
    )


def any_ended(conn: Connection, before: datetime) -> bool:
    """Whether some counter or mark's window ended before `before`: a look that takes no lock."""
    return bool(conn.execute(select(some_ended(before))).scalar_one())


class Pruning:
    """Mixed into `Store`, which provides `_write` (one write transaction) and `_look` (one read)."""

    def _write(self, now: datetime, work: Callable[[Connection], T]) -> T:
        raise NotImplementedError

    def _look(self) -> AbstractContextManager[Connection]:
        raise NotImplementedError

    def prune_expired(self, *, now: datetime, limit: int = BATCH) -> int:
        """Delete up to `limit` counters and `limit` loop marks whose window ended `GRACE` before `now`;
        returns how many rows went (below `2 * limit`: nothing more is due)."""
        before = now - GRACE
        with self._look() as conn:  # nothing ended: no write transaction, no lock
            if not any_ended(conn, before):
                return 0

        def both(conn: Connection) -> int:
            return prune(conn, budget_counters, before, limit) + prune(conn, loop_marks, before, limit)

        return self._write(now, both)
