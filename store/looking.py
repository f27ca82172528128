"""Short reads on the caller's own thread, on a connection that thread keeps: no hand-off, no pool wait.

A read allowed outright looks at its principal's standing, its run and its counters before it asks its
backend (`recording.admissible_read`). On SQLite that look is one indexed lookup in a local file, and a
reader in WAL mode never waits for a writer: handing it to a worker thread and back cost more CPU than
the look itself (about 0.1 ms a call quiet, several times that on a busy machine, where the futex wake of
the hand-off is paid with the GIL held). So the event loop looks itself, on a connection of its own,
kept open: it never waits for the pool, whose connections worker threads may all hold meanwhile.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Connection, Engine

from store.db import READ_ONLY
from store.model import StoreError


class Looks:
    """A read-only connection per thread that looks; shared by the stores of one engine, closed with them."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: set[Connection] = set()
        self._closed = False

    @contextmanager
    def look(self) -> Iterator[Connection]:
        """A read-only transaction on this thread's connection (the caller translates errors).

        A connection whose transaction failed is closed, not kept: the next look opens another.
        """
        conn = self._connection()
        try:
            with conn.begin():
                yield conn
        except BaseException:
            self._forget(conn)
            raise

    def close(self) -> None:
        """Close every thread's connection (at the store's close, when nothing looks any more)."""
        with self._lock:
            self._closed = True
            held, self._open = self._open, set()
        for conn in held:
            conn.close()

    def _connection(self) -> Connection:
        conn: Connection | None = getattr(self._local, "conn", None)
        if conn is not None and not conn.closed and not conn.invalidated:
            return conn
        with self._lock:
            if self._closed:
                raise StoreError("the store is closed")
            conn = self._engine.connect()
            conn.execution_options(**{READ_ONLY: True})
            self._open.add(conn)
        self._local.conn = conn
        return conn

    def _forget(self, conn: Connection) -> None:
        with self._lock:
            self._open.discard(conn)
        self._local.conn = None
        conn.close()
