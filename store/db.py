"""Engine creation for the two supported backends: SQLite (embedded) and PostgreSQL (shared)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url

from store.model import StoreError

READ_ONLY = "writ_read_only"
"""Execution option: the transaction only reads, so SQLite may begin it deferred, beside the writer."""


def normalize_url(url: str) -> URL:
    """Accept `sqlite:///path` and `postgresql://...`; PostgreSQL always goes through psycopg 3.

    Raises:
        StoreError: the URL names a backend the store does not support.
    """
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres", "postgresql+psycopg"):
        return parsed.set(drivername="postgresql+psycopg")
    if parsed.drivername in ("sqlite", "sqlite+pysqlite"):
        return parsed.set(drivername="sqlite+pysqlite")
    raise StoreError(f"unsupported store URL scheme {parsed.drivername!r}: use sqlite:/// or postgresql://")


def create_store_engine(url: str, *, durable: bool = True) -> Engine:
    """An engine configured so that concurrent writers serialize instead of failing."""
    parsed = normalize_url(url)
    if parsed.get_backend_name() == "sqlite":
        return _sqlite_engine(parsed, durable=durable)
    return create_engine(parsed, pool_pre_ping=True, pool_size=10, max_overflow=10)


def _sqlite_engine(url: URL, *, durable: bool) -> Engine:
    if not url.database or url.database == ":memory:":
        raise StoreError("the SQLite store needs a file path: sqlite:///path/to/writ.db")
    Path(url.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
    synchronous = "FULL" if durable else "NORMAL"

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take BEGIN away from pysqlite: it would start transactions late and deferred.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute(f"PRAGMA synchronous={synchronous}")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.execute("PRAGMA foreign_keys=ON")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        # IMMEDIATE takes the write lock up front, so writers from any thread or process queue on
        # busy_timeout instead of failing with SQLITE_BUSY when a read lock would need upgrading.
        if conn.get_execution_options().get(READ_ONLY):
            conn.exec_driver_sql("BEGIN")
        else:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine
