"""Engine creation for the two supported backends: SQLite (embedded) and PostgreSQL (shared)."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from sqlalchemy import Engine, create_engine, event, exc
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from store.model import StoreError

_HOLDS_WRITER = "writ_holds_writer_lock"
_IDLE_SINCE = "writ_idle_since"

READ_ONLY = "writ_read_only"
"""Execution option: the transaction only reads, so SQLite may begin it deferred, beside the writer."""


def normalize_url(url: str) -> URL:
    """Accept `sqlite:///path` and `postgresql://...`; PostgreSQL always goes through psycopg 3.

    Raises:
        StoreError: the URL is not a URL, or names a backend the store does not support.
    """
    try:
        parsed = make_url(url)
    except ArgumentError:
        # SQLAlchemy's own message names no remedy, and reached the user as a traceback.
        raise StoreError(
            f"store URL {url!r} is not a URL: use sqlite:///PATH or postgresql://USER@HOST:PORT/DATABASE"
        ) from None
    if parsed.drivername in ("postgresql", "postgres", "postgresql+psycopg"):
        return parsed.set(drivername="postgresql+psycopg")
    if parsed.drivername in ("sqlite", "sqlite+pysqlite"):
        return parsed.set(drivername="sqlite+pysqlite")
    raise StoreError(f"unsupported store URL scheme {parsed.drivername!r}: use sqlite:/// or postgresql://")


IDLE_TRANSACTION_TIMEOUT_S = 15.0
"""How long PostgreSQL lets a session sit idle inside a transaction before ending it (0: its own setting)."""


PING_AFTER_IDLE_S = 1.0
"""A pooled PostgreSQL connection idle for longer than this is pinged before it is used again."""
POOL_SIZE, MAX_OVERFLOW = 10, 10
"""PostgreSQL connections a process keeps open, and may open beyond those under load."""
LOOK_CONNECTIONS = 4
"""PostgreSQL connections at most that an event loop's reads look on (store.looking), beside the pool.

A look holds its connection for one round trip, so a few serve many concurrent reads; the rest wait on
the loop, which costs nothing of a thread."""


class EngineOptions(TypedDict, total=False):
    """The keyword arguments of `create_store_engine`, for callers that pass them through."""

    durable: bool
    idle_transaction_timeout_s: float
    ping_after_idle_s: float
    pool_size: int
    max_overflow: int


def create_store_engine(
    url: str,
    *,
    durable: bool = True,
    idle_transaction_timeout_s: float = IDLE_TRANSACTION_TIMEOUT_S,
    ping_after_idle_s: float = PING_AFTER_IDLE_S,
    pool_size: int = POOL_SIZE,
    max_overflow: int = MAX_OVERFLOW,
) -> Engine:
    """An engine configured so that concurrent writers serialize instead of failing."""
    parsed = normalize_url(url)
    if parsed.get_backend_name() == "sqlite":
        return _sqlite_engine(parsed, durable=durable)
    engine = create_engine(parsed, pool_size=pool_size, max_overflow=max_overflow)
    return _postgres_engine(
        engine, idle_transaction_timeout_s=idle_transaction_timeout_s, ping_after_idle_s=ping_after_idle_s
    )


@dataclass(frozen=True)
class LookOptions:
    """What an asyncio engine for looks from an event loop (store.looking) takes of `EngineOptions`."""

    idle_transaction_timeout_s: float = IDLE_TRANSACTION_TIMEOUT_S
    ping_after_idle_s: float = PING_AFTER_IDLE_S
    connections: int = LOOK_CONNECTIONS

    @classmethod
    def of(cls, options: EngineOptions) -> LookOptions:
        return cls(
            options.get("idle_transaction_timeout_s", IDLE_TRANSACTION_TIMEOUT_S),
            options.get("ping_after_idle_s", PING_AFTER_IDLE_S),
        )


def create_look_engine(url: URL, options: LookOptions) -> AsyncEngine:
    """An asyncio engine over psycopg's async connection for PostgreSQL `url`, configured as the store's
    synchronous engine is, for reads awaited on an event loop (store.looking)."""
    # A look is a few plain reads: under READ COMMITTED each statement sees its own snapshot inside a
    # transaction too, so BEGIN and COMMIT would buy nothing but two round trips.
    engine = create_async_engine(
        url, pool_size=options.connections, max_overflow=0, isolation_level="AUTOCOMMIT"
    )
    _postgres_engine(
        engine.sync_engine,
        idle_transaction_timeout_s=options.idle_transaction_timeout_s,
        ping_after_idle_s=options.ping_after_idle_s,
    )
    return engine


def _postgres_engine(
    engine: Engine, *, idle_transaction_timeout_s: float, ping_after_idle_s: float
) -> Engine:
    _ping_after_idle(engine, ping_after_idle_s)
    if idle_transaction_timeout_s <= 0:
        return engine
    timeout_ms = max(1, round(idle_transaction_timeout_s * 1000))

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Every write holds the log head's row lock until it commits. A replica frozen inside one
        # (SIGSTOP, a VM pause, a stuck thread) would hold it, and stall every writer of every replica,
        # until it woke. PostgreSQL ends such a session after the timeout instead: the lock is freed, the
        # frozen transaction is rolled back, and its writer finds its connection gone when it wakes.
        # Writ's own transactions never wait on anything but the database: none is idle for long.
        autocommit = dbapi_connection.autocommit
        dbapi_connection.autocommit = True
        try:
            dbapi_connection.execute(f"SET idle_in_transaction_session_timeout = {timeout_ms}")
        finally:
            dbapi_connection.autocommit = autocommit

    return engine


def _ping_after_idle(engine: Engine, idle_s: float) -> None:
    """SQLAlchemy's pre-ping, for connections that sat in the pool longer than `idle_s` only.

    A connection dies while it sits unused: the server restarted, or something on the way ended an idle
    session. Pinging on every checkout (`pool_pre_ping`) finds that out at the cost of a round trip for
    each of a call's two transactions, a quarter of what the store adds to a call. A connection that was
    in use a moment ago is very likely alive (the bypass window connection pools such as HikariCP use);
    if it is not, its first statement fails as a lost connection, which invalidates the whole pool and
    is reported as `Unavailable`, exactly as when the server goes away in the middle of a transaction.
    """

    @event.listens_for(engine, "checkin")
    def _on_checkin(_dbapi_connection: Any, record: Any) -> None:
        record.info[_IDLE_SINCE] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        idle_since = record.info.get(_IDLE_SINCE)
        if idle_since is None or time.monotonic() - idle_since <= idle_s:
            return  # just connected, or in use a moment ago
        dialect = engine.dialect
        try:
            dialect.do_ping(dbapi_connection)
        except dialect.loaded_dbapi.Error as error:
            if dialect.is_disconnect(error, dbapi_connection, None):
                # The pool drops every connection older than this one and checks out a new one.
                raise exc.InvalidatePoolError(f"pooled connection found dead: {error}") from error
            raise


def _create_private(path: Path) -> None:
    """Create the database file (0600) and its missing directories (0700) unless it exists.

    The file holds every call's arguments and results; SQLite would create it, and its -wal and -shm
    files, which take the database file's mode, readable by everyone (0644 under the usual umask).
    """
    missing = [p for p in path.parents if not p.exists()]
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another process made it first
            directory.mkdir(mode=0o700)
    with contextlib.suppress(FileExistsError):  # an empty file is an empty SQLite database
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


SQLITE_PAGE_SIZE = 8192
"""The page size of a SQLite store created now (issue 16 item 8). A page holds whole rows, and a call's
row (about 730 bytes) or event (about 420) leaves on average half of one unused at the end of each
page: at 4 KiB, five `tool_calls` rows and about 90 bytes a call of nothing. A store created before
keeps its pages (SQLite changes them only by a VACUUM outside WAL mode)."""


def _sqlite_engine(url: URL, *, durable: bool) -> Engine:
    if not url.database or url.database == ":memory:":
        raise StoreError("the SQLite store needs a file path: sqlite:///path/to/writ.db")
    _create_private(Path(url.database).expanduser())
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
    synchronous = "FULL" if durable else "NORMAL"

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take BEGIN away from pysqlite: it would start transactions late and deferred.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA page_size={SQLITE_PAGE_SIZE}")  # before WAL: a new file only
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute(f"PRAGMA synchronous={synchronous}")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.execute("PRAGMA foreign_keys=ON")
        finally:
            cursor.close()

    # Writers of this process queue on a lock before SQLite's: its busy handler polls with sleeps of
    # up to 100 ms, which turns a queue of a few threads into a tail of seconds. Only a performance
    # measure: BEGIN IMMEDIATE still serializes writers across processes.
    writer = threading.Lock()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        # IMMEDIATE takes the write lock up front, so writers from any thread or process queue on
        # busy_timeout instead of failing with SQLITE_BUSY when a read lock would need upgrading.
        if conn.get_execution_options().get(READ_ONLY):
            conn.exec_driver_sql("BEGIN")
            return
        writer.acquire()
        conn.info[_HOLDS_WRITER] = True
        try:
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        except BaseException:
            _release(conn)
            raise

    def _finish(statement: str) -> Any:
        def finish(conn: Any) -> None:
            # End the transaction here, before letting the next writer in; pysqlite's own
            # commit()/rollback() that follows finds no transaction and does nothing.
            try:
                dbapi_connection = conn.connection.dbapi_connection
                if dbapi_connection is not None and dbapi_connection.in_transaction:
                    dbapi_connection.execute(statement)
            finally:
                _release(conn)

        return finish

    def _release(conn: Any) -> None:
        if conn.info.pop(_HOLDS_WRITER, False):
            writer.release()

    event.listen(engine, "commit", _finish("COMMIT"))
    event.listen(engine, "rollback", _finish("ROLLBACK"))
    return engine
