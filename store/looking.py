"""Short reads made from the event loop itself: no hand-off to a worker thread and back.

A read allowed outright looks at its principal's standing, its run and its counters before it asks its
backend (`recording.admissible_read`). Handing that look to a worker thread and back cost more CPU than
the look itself: about 0.1 ms a call on a quiet machine, several times that on a busy one, where the
futex wake of the hand-off is paid with the GIL held; with 8 clients on PostgreSQL, the looks in worker
threads halved the gateway's reads per second. So the loop looks itself, on each database in the way
that never blocks it:

- **SQLite** (`ThreadLooks`): the look is one indexed lookup in a local file, and a reader in WAL mode
  never waits for a writer, so the loop makes it synchronously, on a read-only connection of its own
  kept open: it never waits for the pool, whose connections worker threads may all hold meanwhile.
- **PostgreSQL** (`LoopLooks`): the look is a round trip away, which may take as long as the network
  does, so the loop awaits it on an asyncio engine over psycopg's async connection, beside the store's
  synchronous engine, running the same look (`AsyncConnection.run_sync`), each statement in a
  transaction of its own (a round trip each; no BEGIN or COMMIT). An asyncio pool belongs to the loop
  that uses it, so each loop gets an engine of its own.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.ext.asyncio import AsyncEngine

from store.db import READ_ONLY, LookOptions, create_look_engine
from store.model import StoreError

T = TypeVar("T")


class Looks(Protocol):
    """Where a store's looks from an event loop are made; shared by the stores of one engine."""

    async def run(self, look: Callable[[Connection], T]) -> T:
        """`look(conn)` in a read-only transaction, awaited on the running loop (errors untranslated)."""
        ...

    def close(self) -> None:
        """Close every connection the looks hold (at the store's close, when nothing looks any more)."""
        ...


def looks_for(engine: Engine, options: LookOptions | None = None) -> Looks:
    """The looks for `engine`'s database: synchronous on SQLite, awaited on PostgreSQL."""
    if engine.dialect.name == "sqlite":
        return ThreadLooks(engine)
    return LoopLooks(engine, options or LookOptions())


class ThreadLooks:
    """A read-only connection per thread that looks (SQLite): the loop's looks never leave it."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: set[Connection] = set()
        self._closed = False

    async def run(self, look: Callable[[Connection], T]) -> T:
        with self.look() as conn:
            return look(conn)

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


class LoopLooks:
    """Looks awaited on an asyncio engine per event loop (PostgreSQL), made from the store's URL.

    A loop that has closed cannot use its engine again: the engine is disposed when the next loop comes
    (a process with one loop, the gateway's, never has one) or at the store's close, whichever is first.
    psycopg's async connection closes without its loop, so a loop that is gone is no obstacle.
    """

    def __init__(self, engine: Engine, options: LookOptions) -> None:
        self._url = engine.url
        self._options = options
        self._lock = threading.Lock()
        self._engines: dict[asyncio.AbstractEventLoop, AsyncEngine] = {}
        self._closed = False

    async def run(self, look: Callable[[Connection], T]) -> T:
        engine = await self._engine_for(asyncio.get_running_loop())
        async with engine.connect() as conn:  # in autocommit: no BEGIN, no COMMIT (store.db)
            return await conn.run_sync(look)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            engines, self._engines = list(self._engines.values()), {}
        if engines:
            # Disposing awaits each connection's close, and this may run on a loop's own thread (a
            # caller closing the store synchronously) or after every loop is gone: a loop of its own.
            _in_own_loop(_dispose(engines))

    async def _engine_for(self, loop: asyncio.AbstractEventLoop) -> AsyncEngine:
        with self._lock:
            if self._closed:
                raise StoreError("the store is closed")
            engine = self._engines.get(loop)
            if engine is not None:
                return engine
            engine = self._engines[loop] = create_look_engine(self._url, self._options)
            gone = [held for other, held in self._engines.items() if other.is_closed()]
            self._engines = {other: held for other, held in self._engines.items() if not other.is_closed()}
        await _dispose(gone)
        return engine


async def _dispose(engines: list[AsyncEngine]) -> None:
    for engine in engines:
        await engine.dispose()


def _in_own_loop(work: Coroutine[Any, Any, None]) -> None:
    """Run the coroutine `work` to its end on a new loop in a thread of its own, and re-raise its error."""
    failed: list[BaseException] = []

    def target() -> None:
        try:
            asyncio.run(work)
        except BaseException as error:  # handed to the caller's thread below
            failed.append(error)

    thread = threading.Thread(target=target, name="writ-close-looks")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
