"""Replaying the log into scratch projections, and comparing them with the ones the runtime acts on.

The gateway decides from the projections (a call's status, its approval, who holds a key, a budget's
use, who is revoked), not from the log. Someone with write access to the database can change those
rows and leave the log alone: the chain stays intact while the gateway acts on something no event
allows. `Replay` folds every event through the one projector (`store.projector`, the same code that
writes the live rows and `writ store rebuild`) into a temporary SQLite database of its own, never the
live tables, and `compare` walks both sides in primary-key order, one row at a time, naming the first
row that differs.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, String, Table, create_engine, event, exc, select

from store import events as ev
from store.model import ProjectionDifference, ScratchUnavailable
from store.projector import apply
from store.schema import PROJECTION_TABLES, budget_counters, loop_marks, metadata

PRUNED_TABLES = (budget_counters, loop_marks)
"""Projections whose rows of ended windows the periodic prune deletes (store.pruning)."""
_PAGE = 1000
_SHOWN = 120
"""Characters of a value a difference shows; the rest is elided."""


class Replay:
    """Scratch projections, built event by event; a context manager that deletes them on exit."""

    def __init__(self) -> None:
        """Raises: ScratchUnavailable: the temporary directory ($TMPDIR) cannot hold the file."""
        try:
            self._dir = tempfile.TemporaryDirectory(prefix="writ-verify-")
        except OSError as error:
            raise ScratchUnavailable(_scratch_failed(tempfile.gettempdir(), error)) from error
        self._path = Path(self._dir.name) / "replay.db"
        self._engine = _scratch_engine(self._path)
        try:
            metadata.create_all(self._engine, tables=list(PROJECTION_TABLES))
        except exc.OperationalError as error:
            self._engine.dispose()
            self._dir.cleanup()
            raise ScratchUnavailable(_scratch_failed(self._path, error.orig)) from error
        self._conn = self._engine.connect()
        self._tx = self._conn.begin()

    def __enter__(self) -> Replay:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._tx.rollback()
        self._conn.close()
        self._engine.dispose()
        self._dir.cleanup()

    def apply(self, event: ev.Event) -> None:
        """Project one event into the scratch tables, exactly as the live append does.

        Raises:
            StoreError, KeyClaimLost, IntegrityError: the event cannot be applied (a second claim of a
                held key, a row inserted twice, an event naming no row).
            ScratchUnavailable: the scratch file cannot be written.
        """
        try:
            apply(self._conn, event)
        except exc.OperationalError as error:  # the scratch file's own trouble (a full disk), not the log's
            raise ScratchUnavailable(_scratch_failed(self._path, error.orig)) from error

    def compare(self, live: Connection, now: datetime | None = None) -> list[ProjectionDifference]:
        """The first differing row of each projection table (in `PROJECTION_TABLES` order), or none.

        A budget counter or loop mark whose window ended before `now` (default: the wall clock) may be
        missing from the live table: the periodic prune deleted it (store.pruning), and admission
        never reads it again. One that is there must still match.
        """
        ended = now or datetime.now(UTC)
        differences = []
        for table in PROJECTION_TABLES:
            pruned = _pruned(ended) if table in PRUNED_TABLES else None
            difference = _first_difference(table, _rows(live, table), _rows(self._conn, table), pruned)
            if difference is not None:
                differences.append(difference)
        return differences


def _scratch_failed(where: object, error: object) -> str:
    return (
        f"verify's scratch database at {where} failed ({error}): it needs room for a copy of the "
        "projections; point TMPDIR at a directory that has it"
    )


def _scratch_engine(path: Path) -> Engine:
    engine = create_engine(f"sqlite:///{path}")

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # A throwaway file: nothing needs to survive a crash, so nothing is journaled or synced.
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("PRAGMA journal_mode=OFF")
            cursor.execute("PRAGMA synchronous=OFF")
        finally:
            cursor.close()

    return engine


def _rows(conn: Connection, table: Table) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """(primary key, row) in primary-key order, streamed.

    Both sides must sort alike: SQLite compares text by its UTF-8 bytes, PostgreSQL by the database's
    collation unless told `C` (bytes as well), which is also the order Python gives `str`.
    """
    key_columns = list(table.primary_key.columns)
    postgres = conn.dialect.name == "postgresql"
    order = [c.collate("C") if postgres and isinstance(c.type, String) else c for c in key_columns]
    query = select(table).order_by(*order).execution_options(yield_per=_PAGE)
    at = [list(table.columns).index(c) for c in key_columns]
    with conn.execute(query) as result:  # closed, server-side cursor and all, when the walk stops early
        for row in result:
            yield tuple(row[i] for i in at), row


def _pruned(ended: datetime) -> Callable[[Any], bool]:
    def pruned(row: Any) -> bool:
        return row.resets_at is not None and row.resets_at < ended

    return pruned


def _first_difference(
    table: Table,
    stored: Iterator[tuple[tuple[Any, ...], Any]],
    replayed: Iterator[tuple[tuple[Any, ...], Any]],
    pruned: Callable[[Any], bool] | None = None,
) -> ProjectionDifference | None:
    names = [c.name for c in table.primary_key.columns]
    left, right = next(stored, None), next(replayed, None)
    while left is not None or right is not None:
        if right is None or (left is not None and left[0] < right[0]):
            assert left is not None
            return ProjectionDifference(table.name, _key(names, left[0]), None, "a row", "absent")
        if left is None or right[0] < left[0]:
            if pruned is not None and pruned(right[1]):
                right = next(replayed, None)
                continue
            return ProjectionDifference(table.name, _key(names, right[0]), None, "absent", "a row")
        if tuple(left[1]) != tuple(right[1]):  # both select(table): the same columns in the same order
            for column, ours, theirs in zip(table.columns, left[1], right[1], strict=True):
                if ours != theirs:
                    return ProjectionDifference(
                        table.name, _key(names, left[0]), column.name, _shown(ours), _shown(theirs)
                    )
        left, right = next(stored, None), next(replayed, None)
    return None


def _key(names: list[str], values: tuple[Any, ...]) -> tuple[tuple[str, str], ...]:
    return tuple((name, str(value)) for name, value in zip(names, values, strict=True))


def _shown(value: Any) -> str:
    text = ev.format_ts(value) if isinstance(value, datetime) else repr(value)
    return text if len(text) <= _SHOWN else f"{text[:_SHOWN]}... ({len(text)} characters)"
