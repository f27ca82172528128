"""Appending to the hash-chained log under the head lock, and reading it back in pages."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from sqlalchemy import ColumnElement, Connection, Row, select, update

from store import events as ev
from store import queues
from store.model import TERMINAL_STATUSES, CallView, CorruptEvent, StoredEvent, StoreError
from store.projector import Pending, apply
from store.raw import Statement, flush
from store.schema import events, log_head
from store.views import call_view, load_call

PAGE_SIZE = 1000

# Run on the raw cursor (store.raw), compiled once per dialect. PostgreSQL: a row lock all writers
# queue on. SQLite: the IMMEDIATE transaction already holds the database's write lock and FOR UPDATE is
# not rendered.
_LOCK_HEAD = Statement(
    select(log_head.c.last_seq, log_head.c.last_hash).where(log_head.c.id == 1).with_for_update()
)
_MOVE_HEAD = Statement(update(log_head).where(log_head.c.id == 1))  # sets last_seq and last_hash
_INSERT_EVENTS = Statement(events.insert())


class Append:
    """The events of one transaction: each is sealed onto the chain and projected as it is added.

    Opening one takes the head lock, so every writer of every replica appends in one total order.
    """

    def __init__(self, conn: Connection) -> None:
        head = _LOCK_HEAD.one_or_none(conn, {})
        if head is None:
            raise StoreError("the store is not migrated: run `writ store migrate`")
        self._conn = conn
        self._seq: int = head.last_seq
        self._hash: str = head.last_hash
        self._rows: list[dict[str, Any]] = []
        self._pending = Pending()

    def add(self, event: ev.Event) -> ev.Event:
        """Seal `event` at the next seq, project it, and return the sealed copy."""
        sealed, envelope = event.sealed_with_envelope(self._seq + 1, self._hash)
        apply(self._conn, sealed, self._pending)
        self._rows.append(_row(envelope))
        self._seq, self._hash = sealed.seq, sealed.hash
        return sealed

    def flush(self) -> None:
        """Write the held projection rows and the sealed events and move the head; the caller commits.

        On PostgreSQL all of it, and the projection's deferred writes, is one round trip (store.raw),
        sent here so that a refusal among them is heard by this write, inside its own savepoint.
        """
        if self._rows:
            _INSERT_EVENTS.defer_many(self._conn, self._rows)
            _MOVE_HEAD.defer(self._conn, {"last_seq": self._seq, "last_hash": self._hash})
            self._rows = []
        self._pending.write(self._conn)
        flush(self._conn)
        self._pending.settle()
        # Held full arguments (redacted fields in clear) outlive no call: whichever path settles it
        # (dispatch, reconciliation, a person resolving it, a refusal), they go in the same transaction.
        for row in self._pending.written.values():
            if row.status in TERMINAL_STATUSES and row.approval_id is not None:
                queues.release(self._conn, row.approval_id)

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


def row_of(event: ev.Envelope) -> dict[str, Any]:
    """The events-table row of a sealed event; the payload is the canonical JSON that was hashed."""
    return _row(event.envelope())


def _row(envelope: dict[str, Any]) -> dict[str, Any]:
    envelope["payload"] = ev.json_for(envelope["schema_version"])(envelope["payload"])
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
