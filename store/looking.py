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
import time
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar

from sqlalchemy import Connection, Engine, exc
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

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
        self._loops: dict[asyncio.AbstractEventLoop, _LoopLooks] = {}
        self._closed = False

    async def run(self, look: Callable[[Connection], T]) -> T:
        looks = await self._looks_of(asyncio.get_running_loop())
        return await looks.run(look)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            held, self._loops = list(self._loops.values()), {}
        if held:
            # Closing awaits each connection's close, and this may run on a loop's own thread (a caller
            # closing the store synchronously) or after every loop is gone: a loop of its own.
            _in_own_loop(_close_all(held))

    async def _looks_of(self, loop: asyncio.AbstractEventLoop) -> _LoopLooks:
        with self._lock:
            if self._closed:
                raise StoreError("the store is closed")
            looks = self._loops.get(loop)
            if looks is not None:
                return looks
            options = self._options
            looks = self._loops[loop] = _LoopLooks(create_look_engine(self._url, options), options)
            gone = [held for other, held in self._loops.items() if other.is_closed()]
            self._loops = {other: held for other, held in self._loops.items() if not other.is_closed()}
        await _close_all(gone)
        return looks


class _LoopLooks:
    """One loop's looks: its engine, the connections kept between looks, and the bound on looks at once.

    A connection is kept checked out between looks, not returned to the pool: checking out and in costs
    more than the look's statement (SQLAlchemy's greenlet entered twice more, the reset on return). The
    pool's ping before it hands out a connection idle for `ping_after_idle_s` is kept in its own way: a
    look on a kept connection idle that long that finds it dead is made again, once, on a new one (a
    look only reads). A connection whose look failed otherwise, or was cancelled, is closed, not kept.
    """

    def __init__(self, engine: AsyncEngine, options: LookOptions) -> None:
        self.engine = engine
        self._idle_s = options.ping_after_idle_s
        self._kept: list[tuple[AsyncConnection, float]] = []  # with when each was last used
        self._slots = asyncio.Semaphore(options.connections)  # never more connections than the pool's

    async def run(self, look: Callable[[Connection], T]) -> T:
        async with self._slots:
            conn, idle_s = await self._take()
            try:
                answer = await _look_on(conn, look)
            except exc.DBAPIError as error:
                if not (error.connection_invalidated and idle_s > self._idle_s):
                    raise
                conn = await self.engine.connect()  # found dead after sitting unused: once, anew
                answer = await _look_on(conn, look)
            self._kept.append((conn, time.monotonic()))
            return answer

    async def close(self) -> None:
        kept, self._kept = self._kept, []
        for conn, _ in kept:
            await conn.close()
        await self.engine.dispose()

    async def _take(self) -> tuple[AsyncConnection, float]:
        """A kept connection and how long it sat unused, or a new one from the pool (0)."""
        if self._kept:
            conn, used_at = self._kept.pop()
            return conn, time.monotonic() - used_at
        return await self.engine.connect(), 0.0


async def _look_on(conn: AsyncConnection, look: Callable[[Connection], T]) -> T:
    """`look` on `conn`; a connection whose look failed or was cancelled is closed, never kept."""
    try:
        return await conn.run_sync(look)
    except BaseException:
        # Shielded as SQLAlchemy's own `async with` shields it: a cancelled look's connection still closes.
        await asyncio.shield(conn.close())
        raise


async def _close_all(loops: list[_LoopLooks]) -> None:
    for looks in loops:
        await looks.close()


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
