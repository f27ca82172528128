"""Appending to the hash-chained log under the head lock, and reading it back in pages."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any
from weakref import WeakKeyDictionary

from sqlalchemy import ColumnElement, Connection, Engine, Row, bindparam, func, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from store import events as ev
from store import queues
from store.model import TERMINAL_STATUSES, CallView, CorruptEvent, StoredEvent, StoreError
from store.partitions import UNPARTITIONED, Partitioning, scheme_of
from store.projector import Pending, apply
from store.raw import Statement
from store.schema import events, events_seq, log_head, read_correlation, stored_correlation
from store.views import call_view, load_call

PAGE_SIZE = 1000

# Run on the raw cursor (store.raw), compiled once per dialect. PostgreSQL: a row lock the writers of
# one partition queue on. SQLite: the IMMEDIATE transaction already holds the database's write lock and
# FOR UPDATE is not rendered.
_LOCK_HEAD = Statement(
    select(log_head.c.last_seq, log_head.c.last_hash)
    .where(log_head.c.partition == bindparam("p"))
    .with_for_update()
)
# Out of order: taken only if no one holds it (a lock not waited for cannot close a deadlock's cycle).
_TAKE_HEAD_IF_FREE = Statement(
    select(log_head.c.last_seq, log_head.c.last_hash)
    .where(log_head.c.partition == bindparam("p"))
    .with_for_update(skip_locked=True)
)
_MOVE_HEAD = Statement(update(log_head).where(log_head.c.partition == bindparam("p")))
_INSERT_EVENTS = Statement(events.insert())
_ONE_STATEMENT_PARAMETERS = 50
"""Parameters at most of the statement that appends events with their head's move on PostgreSQL
(`_appended`): psycopg caches a statement's placeholders converted only up to 50 parameters (and 4 KiB
of text), and converting them again on every execute costs more than the round trip it saves. So two
events of 18 columns go in one statement, and a read's three in two, as before."""
_HEAD_MOVE = ("p", "last_seq", "last_hash")
"""The head's parameters in that statement, beside the events'."""
_APPENDS: dict[tuple[int, tuple[str, ...]], Statement] = {}
_NEXT_SEQ = Statement(select(events_seq.next_value()))

# PostgreSQL, several partitions: `events_seq` gives seqs in the order they are taken, not in the order
# of COMMIT, so a reader that follows the log by seq could pass a seq still in flight and never see it.
# Before its first seq, a write takes a shared advisory lock (to the end of its transaction, or of the
# savepoint it runs in) whose key holds the sequence's value then: its floor, below every seq it takes.
# `settled_seq` reads the sequence, then the floors in flight: every seq up to the lowest is settled.
# The key is the store's schema's (keys are per database) and the floor's low 32 bits (a write in
# flight is never 2**32 seqs behind). `events_seq` keeps its default CACHE 1: `last_value` is then the
# last seq handed out to anyone.
_FLOOR_CLASS = "hashtext('writ.events_seq:' || current_schema())"
_LAST_TAKEN = "(last_value - CAST(NOT is_called AS integer))"
_TAKE_FLOOR = text(
    f"SELECT pg_advisory_xact_lock_shared({_FLOOR_CLASS}, "
    f"CAST(({_LAST_TAKEN} + 2147483648) % 4294967296 - 2147483648 AS integer)) FROM events_seq"
)
_SETTLED = text(
    f"SELECT {_LAST_TAKEN} AS taken, ("
    f"  SELECT min({_LAST_TAKEN}"
    f"    - (({_LAST_TAKEN} - l.objid::bigint) % 4294967296 + 4294967296) % 4294967296)"
    "   FROM pg_locks AS l"
    "   WHERE l.locktype = 'advisory' AND l.objsubid = 2"
    "   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    f"  AND l.classid::bigint = ({_FLOOR_CLASS}::bigint + 4294967296) % 4294967296"
    ") AS floor FROM events_seq"
)
_LAST_SEQ = Statement(select(func.max(events.c.seq)))

_HELD = "writ.log_heads"
"""conn.info key: (the transaction, the partitions whose heads it locked in order, when it took the first)."""


class PartitionOrder(StoreError):
    """A write needs a partition's head it did not hold when it began (PostgreSQL, several
    partitions), or one below a head its transaction holds: it must run again once `partitions` are
    held, taken in sorted order (two replicas taking heads in two orders could deadlock)."""

    def __init__(self, partitions: frozenset[str]) -> None:
        super().__init__(f"the log heads {sorted(partitions)} must be locked in order")
        self.partitions = partitions


@dataclass(slots=True)
class _Chain:
    seq: int
    hash: str


class Append:
    """The events of one transaction: each is sealed onto its partition's chain and projected as it is
    added (store.partitions).

    With one partition (the default), opening one takes the head lock, so every writer of every replica
    appends in one total order. With several, each partition's head is locked when the first event for
    it is added, and held to COMMIT: writers to other partitions do not wait.
    """

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._scheme = scheme_of(conn.engine)
        self._chains: dict[str, _Chain] = {}
        self._next_global: int | None = None
        self._floored = False  # PostgreSQL, several partitions: this append's floor is held
        self._rows: list[dict[str, Any]] = []
        self._pending = Pending()
        if _CHECKED.get(conn.engine) != self._scheme:
            _check_scheme(conn, self._scheme)
        # PostgreSQL, several partitions: what the transaction reads before appending must be read
        # under the heads it appends to, as with one partition, so a head must be held before the
        # work began; SQLite's write lock, taken at BEGIN, already covers every read.
        self._late = None if conn.dialect.name != "postgresql" else frozenset(_held(conn))
        if self._scheme.single:
            self._chain(UNPARTITIONED)

    def _chain(self, partition: str) -> _Chain:
        chain = self._chains.get(partition)
        if chain is None:
            if self._late is not None and not self._scheme.single and partition not in self._late:
                # Locked only now, it would not cover what the work read: start again holding it.
                raise PartitionOrder(self._late | {partition})
            chain = self._chains[partition] = lock_head(self._conn, partition)
        return chain

    def _seq(self, chain: _Chain) -> int:
        if self._scheme.single:
            return chain.seq + 1
        if self._conn.dialect.name == "postgresql":
            if not self._floored:
                self._conn.execute(_TAKE_FLOOR)
                self._floored = True
            return int(_NEXT_SEQ.one(self._conn, {})[0])
        if self._next_global is None:  # SQLite: the transaction holds the only write lock
            self._next_global = int(_LAST_SEQ.one(self._conn, {})[0] or 0)
        self._next_global += 1
        return self._next_global

    def add(self, event: ev.Event) -> ev.Event:
        """Seal `event` at its partition's next seq, project it, and return the sealed copy."""
        partition = self._scheme.partition_of(event)
        chain = self._chain(partition)
        sealed, envelope, payload_text = event.sealed_with_payload_text(self._seq(chain), chain.hash)
        apply(self._conn, sealed, self._pending)
        chain.seq += 1
        chain.hash = sealed.hash
        self._rows.append(_row(envelope, payload_text) | {"partition": partition, "pseq": chain.seq})
        return sealed

    def flush(self) -> None:
        """Write the held projection rows and the sealed events and move the heads; the caller commits."""
        self._pending.write(self._conn)
        # Held full arguments (redacted fields in clear) outlive no call: whichever path settles it
        # (dispatch, reconciliation, a person resolving it, a refusal), they go in the same transaction.
        for row in self._pending.written.values():
            if row.status in TERMINAL_STATUSES and row.approval_id is not None:
                queues.release(self._conn, row.approval_id)
        if not self._rows:
            return
        rows, self._rows = self._rows, []
        moved = sorted({row["partition"] for row in rows})
        if (
            self._conn.dialect.name == "postgresql"
            and len(moved) == 1
            and len(rows) * len(rows[0]) + len(_HEAD_MOVE) <= _ONE_STATEMENT_PARAMETERS
        ):
            # One exchange with the server, where the events' insert and the head's move took two.
            chain = self._chains[moved[0]]
            params = {f"{name}_{i}": value for i, row in enumerate(rows) for name, value in row.items()}
            params |= dict(zip(_HEAD_MOVE, (moved[0], chain.seq, chain.hash), strict=True))
            _appended(len(rows), tuple(rows[0])).execute(self._conn, params)
            return
        _INSERT_EVENTS.execute_many(self._conn, rows)
        for partition in moved:
            chain = self._chains[partition]
            _MOVE_HEAD.execute(self._conn, {"p": partition, "last_seq": chain.seq, "last_hash": chain.hash})

    def call(self, tool_call_id: str) -> CallView:
        """The call as it stands after `flush`, without reading it again if this append wrote it.

        The row the last write of it returned is the row a read would find: nothing else in the
        transaction writes to the call's row.
        """
        row = self._pending.written.get(tool_call_id)
        call = call_view(row) if row is not None else load_call(self._conn, tool_call_id)
        if call is None:
            raise StoreError(f"call {tool_call_id} vanished inside its own transaction")
        return call


def commits_in_seq_order(engine: Engine) -> bool:
    """Whether every write commits in the order of its seqs: SQLite (one writer at a time) and a log
    of one partition (every write holds its one head to COMMIT). Not PostgreSQL with several."""
    return engine.dialect.name != "postgresql" or scheme_of(engine).single


def settled_seq(conn: Connection) -> int:
    """The highest seq below which no event is still in flight, for a reader that follows a log that
    does not commit in seq order (`commits_in_seq_order`) by seq.

    Read it before, and apart from, the snapshot that reads the events: a write in flight then is in
    `pg_locks`, and one that ended is in the later snapshot.
    """
    row = conn.execute(_SETTLED).one()
    return int(row.taken if row.floor is None else min(row.taken, row.floor))


_CHECKED: WeakKeyDictionary[Engine, Partitioning] = WeakKeyDictionary()


def _check_scheme(conn: Connection, scheme: Partitioning) -> None:
    """Once per engine: a log written with partitions cannot go back to one, and the first append
    with partitions on PostgreSQL moves `events_seq` past the seqs one partition gave."""
    if scheme.single:
        if conn.execute(select(log_head.c.partition).where(log_head.c.partition != "").limit(1)).first():
            raise StoreError(
                "the log has several partitions: keep store.log.partition_by as it was set "
                "(a log cannot go back to one partition)"
            )
    elif conn.dialect.name == "postgresql":
        conn.execute(
            text(
                "SELECT setval('events_seq', m) FROM (SELECT max(seq) AS m FROM events) AS x "
                "WHERE m >= (SELECT last_value FROM events_seq)"
            )
        )
    _CHECKED[conn.engine] = scheme


def _appended(count: int, names: tuple[str, ...]) -> Statement:
    """PostgreSQL: insert `count` events (their columns `names`, bound as `name_i`) and move their
    partition's head (`p`, `last_seq`, `last_hash`), in one statement: the insert as a CTE of the update.

    Both run in the statement's one snapshot on tables that read nothing of each other (no trigger, no
    foreign key between them), so the result is that of the two statements; either failing fails it.
    """
    key = (count, names)
    statement = _APPENDS.get(key)
    if statement is None:
        columns = events.c
        # Typed as their columns, so each value goes through its column's bind processor (a multi-row
        # VALUES types only the first row's parameters from the columns).
        rows = [
            {name: bindparam(f"{name}_{i}", type_=columns[name].type) for name in names} for i in range(count)
        ]
        inserted = events.insert().values(rows).cte("appended")
        statement = _APPENDS[key] = Statement(
            update(log_head).where(log_head.c.partition == bindparam("p")).add_cte(inserted)
        )
    return statement


def lock_head(conn: Connection, partition: str) -> _Chain:
    """Lock `partition`'s head for the rest of the transaction (made at genesis if it is new).

    A head that sorts before one the transaction holds is taken only if it is free, since waiting
    for it could deadlock with a transaction taking the two in order.

    Raises:
        PartitionOrder: on PostgreSQL, the transaction holds a head that sorts after it, and this one
            is held by another transaction (or does not exist yet).
        StoreError: the store is not migrated.
    """
    held = _held(conn)
    if held and partition not in held and partition < max(held) and conn.dialect.name == "postgresql":
        head = _TAKE_HEAD_IF_FREE.one_or_none(conn, {"p": partition})
        if head is None:
            raise PartitionOrder(frozenset(held) | {partition})
    else:
        head = _LOCK_HEAD.one_or_none(conn, {"p": partition})
    if head is None:
        if partition == UNPARTITIONED:
            raise StoreError("the store is not migrated: run `writ store migrate`")
        _create_head(conn, partition)
        head = _LOCK_HEAD.one(conn, {"p": partition})
    if not held:
        conn.info[_HELD] = (conn.get_transaction(), held, time.perf_counter())
    if partition not in held:
        held.append(partition)
    return _Chain(head.last_seq, head.last_hash)


def lock_heads(conn: Connection, partitions: Iterable[str]) -> None:
    """Lock the heads of `partitions` in sorted order: what a transaction told `PartitionOrder` does.

    Raises:
        PartitionOrder: one sorts below a head already held and another transaction holds it.
    """
    for partition in sorted(set(partitions)):
        lock_head(conn, partition)


def lock_all_heads(conn: Connection) -> None:
    """Lock every partition's head (in order): no append lands until the transaction ends."""
    lock_heads(conn, conn.execute(select(log_head.c.partition)).scalars())


def _held(conn: Connection) -> list[str]:
    transaction = conn.get_transaction()
    kept = conn.info.get(_HELD)
    if kept is None or kept[0] is not transaction:
        kept = conn.info[_HELD] = (transaction, [], None)
    held: list[str] = kept[1]
    return held


def head_locked_at(conn: Connection) -> float | None:
    """When (`time.perf_counter`) the open transaction took its first log head (None: it took none)."""
    kept = conn.info.get(_HELD)
    if kept is None or kept[0] is not conn.get_transaction():
        return None
    locked_at: float | None = kept[2]
    return locked_at


def _create_head(conn: Connection, partition: str) -> None:
    values = {"partition": partition, "last_seq": 0, "last_hash": ev.GENESIS_HASH}
    if conn.dialect.name == "postgresql":
        conn.execute(pg_insert(log_head).values(values).on_conflict_do_nothing())
    else:
        conn.execute(sqlite_insert(log_head).values(values).on_conflict_do_nothing())


def _row(envelope: dict[str, Any], payload_text: str) -> dict[str, Any]:
    envelope["payload"] = payload_text
    envelope["correlation_id"] = stored_correlation(envelope["correlation_id"], envelope["tool_call_id"])
    return envelope


def envelope_of(row: Row[Any]) -> dict[str, Any]:
    """The envelope dict of a stored row, exactly as it was hashed.

    Raises:
        CorruptEvent: the stored payload is not JSON text.
    """
    mapping = dict(row._mapping)
    try:
        mapping["payload"] = json.loads(mapping["payload"])
    except (ValueError, TypeError):  # not JSON, or not text at all (SQLite stores whatever it is given)
        raise CorruptEvent(mapping["seq"], "has a payload that is not JSON") from None
    mapping["correlation_id"] = read_correlation(mapping["correlation_id"], mapping["tool_call_id"])
    return {name: mapping[name] for name in ev.ENVELOPE_FIELDS}


def stored_event(row: Row[Any]) -> StoredEvent:
    return StoredEvent(**envelope_of(row))


def read_pages(
    conn: Connection, *filters: ColumnElement[bool], after_seq: int = 0, limit: int | None = None
) -> Iterator[Row[Any]]:
    """Rows in seq order, fetched in keyset pages so a long log never sits in memory at once."""
    remaining = limit
    while remaining is None or remaining > 0:
        size = PAGE_SIZE if remaining is None else min(PAGE_SIZE, remaining)
        page = conn.execute(
            select(events).where(events.c.seq > after_seq, *filters).order_by(events.c.seq).limit(size)
        ).all()
        yield from page
        if len(page) < size:
            return
        after_seq = page[-1].seq
        if remaining is not None:
            remaining -= len(page)


def partition_rows(
    conn: Connection, partition: str, after_pseq: int = 0, upto_pseq: int | None = None
) -> Iterator[Row[Any]]:
    """One partition's rows in its own seq order (`pseq`) after `after_pseq` (up to `upto_pseq`), in
    keyset pages."""
    bound = () if upto_pseq is None else (events.c.pseq <= upto_pseq,)
    while True:
        page = conn.execute(
            select(events)
            .where(events.c.partition == partition, events.c.pseq > after_pseq, *bound)
            .order_by(events.c.pseq)
            .limit(PAGE_SIZE)
        ).all()
        yield from page
        if len(page) < PAGE_SIZE:
            return
        after_pseq = page[-1].pseq
