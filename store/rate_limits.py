"""Rate-limit buckets in the store, so every replica of a gateway draws on the same ones.

Each bucket is a generic cell rate algorithm (GCRA, the token bucket in one number): its theoretical
arrival time `tat`. A call may pass when taking one more interval (1/rate) leaves `tat` at most
`burst` intervals ahead of now. Taking is one upsert whose `WHERE` re-reads the row it locks, so
concurrent replicas on PostgreSQL serialize on the bucket's row and never both take its last token.
A call drawing on several buckets takes them in one transaction, in key order (no deadlock between
two such calls), and takes none if any is empty.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, text

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Bucket:
    """One limit to draw on: its key (e.g. tenant and subject), and its rate and burst."""

    key: str
    per_s: float
    burst: int


class _Empty(Exception):
    def __init__(self, retry_after_s: float) -> None:
        self.retry_after_s = retry_after_s


_TAKE = {
    "postgresql": text(
        "INSERT INTO rate_buckets AS b (bucket, tat) VALUES (:bucket, :now + :interval) "
        "ON CONFLICT (bucket) DO UPDATE SET tat = GREATEST(b.tat, :now) + :interval "
        "WHERE GREATEST(b.tat, :now) + :interval - :now <= :window RETURNING tat"
    ),
    "sqlite": text(
        "INSERT INTO rate_buckets (bucket, tat) VALUES (:bucket, :now + :interval) "
        "ON CONFLICT (bucket) DO UPDATE SET tat = MAX(rate_buckets.tat, :now) + :interval "
        "WHERE MAX(rate_buckets.tat, :now) + :interval - :now <= :window RETURNING tat"
    ),
}
_TAT = text("SELECT tat FROM rate_buckets WHERE bucket = :bucket")


class RateLimits:
    """Mixed into `Store`, which provides the engine."""

    @property
    def engine(self) -> Engine:
        raise NotImplementedError

    def _errors_translated(self) -> AbstractContextManager[None]:
        raise NotImplementedError

    def take_tokens(self, buckets: Sequence[Bucket], now: float | None = None) -> float | None:
        """Take one call from every bucket: None if taken, else the seconds until one would pass.

        `now` is seconds since the epoch (default: this host's clock; replicas' clocks should agree
        to well under one interval, as they must for leases).
        """
        if not buckets:
            return None
        moment = time.time() if now is None else now
        try:
            self._unflushed(lambda conn: _take(conn, sorted(buckets, key=lambda b: b.key), moment))
        except _Empty as empty:
            return empty.retry_after_s
        return None

    def _unflushed(self, work: Callable[[Connection], T]) -> T:
        # The buckets are soft state: their commit need not wait for a flush to disk. On PostgreSQL
        # the table is unlogged; on SQLite (WAL),
        # synchronous=NORMAL defers the fsync to the next durable commit or checkpoint.
        with self._errors_translated(), self.engine.connect() as conn:
            if conn.dialect.name == "sqlite":
                dbapi: Any = conn.connection.dbapi_connection
                level = dbapi.execute("PRAGMA synchronous").fetchone()[0]
                dbapi.execute("PRAGMA synchronous=NORMAL")
                try:
                    with conn.begin():
                        return work(conn)
                finally:
                    dbapi.execute(f"PRAGMA synchronous={int(level)}")
            with conn.begin():
                # No `SET LOCAL synchronous_commit = off` (a round trip): a transaction that wrote
                # only unlogged tables wrote no WAL, and PostgreSQL flushes nothing at its commit.
                return work(conn)


def _take(conn: Connection, buckets: Sequence[Bucket], now: float) -> None:
    take = _TAKE[conn.dialect.name]
    for bucket in buckets:
        interval = 1.0 / bucket.per_s
        window = bucket.burst * interval
        params = {"bucket": bucket.key, "now": now, "interval": interval, "window": window}
        if conn.execute(take, params).first() is None:
            # Raising rolls back the buckets already taken by this call; the wait is the longest of
            # every bucket this call needs, so a retry after it is not refused by the next one.
            raise _Empty(max(_wait(conn, b, now) for b in buckets))


def _wait(conn: Connection, bucket: Bucket, now: float) -> float:
    tat = conn.execute(_TAT, {"bucket": bucket.key}).scalar_one_or_none()
    interval = 1.0 / bucket.per_s
    return 0.0 if tat is None else max(0.0, max(float(tat), now) + interval - bucket.burst * interval - now)
