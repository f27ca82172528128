"""Group commit: one writer thread per store commits every pending write of the process in one transaction.

Each write is a function of a connection (what `Store._write` runs). Callers put it on a queue and
wait; the writer takes everything queued, up to `MAX_BATCH`, and runs it in one transaction: one head
lock, one COMMIT and one fsync (SQLite) or WAL flush (PostgreSQL) for all of them. Each write runs in
a savepoint of its own when it is not alone, so one that fails (a refusal such as `StaleLease`, a lost
key race, a constraint) rolls back only its own statements and hears only its own error; the others
commit. Nobody hears an answer before the COMMIT that made it durable has returned: if the COMMIT
fails, every write of the batch hears that failure, as each would have alone.

Writes queued while a transaction of several writes runs join it, each in a savepoint of its own,
up to `MAX_BATCH` in all, when it already holds the log heads they need: on a log of one partition,
every write; with several, a write whose heads are known and among those the transaction took first.
Any other waits for the next transaction, so heads are still taken in order and nothing deadlocks.
A joined write is answered with the batch, after its COMMIT. Each transaction thus serves the writes
that arrive while it runs as well as those queued before it began: fewer COMMITs, fewer WAL flushes.

A write alone in its batch (the usual case with one client) runs without a savepoint, exactly as it
ran before group commit, and nothing joins it. Under load the writer gathers a fuller batch. When the
process's calls announce themselves (store.coming: the gateway's pipeline does), it waits, at most
`COMING_S`, while any call is *coming*: on this process's CPU on its way to a commit, neither queued
nor away at its backend. Those calls keep the CPU busy meanwhile, so the wait costs no throughput,
and one COMMIT then serves them too. It also waits for a call away at its backend that is *due back*
within the bound, by that backend's usual answer time, until the call turns late
(store.coming.AwayTimes): a write spends most of its life at its backend, and without this few writes
are ever coming at once. A call alone in the process is never coming nor due while its own write
waits, so one client's sequential calls never wait. A process whose calls do not announce themselves
(a store used directly) falls back on a guess: when the last transaction had company, it waits, at
most `GATHER_S`, for as many writes as came last time.

On SQLite the writer keeps one connection (a warm page cache). A write that
runs another write inside it (the writer's own thread) joins the batch it is in, in a nested savepoint.
With several log partitions (store.partitions), a transaction that finds it needs a head below one it
holds starts again taking all it needs in sorted order, so replicas never deadlock on heads.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from sqlalchemy import Connection, Engine, exc

from store.coming import Arrivals, Coming, current
from store.log import PartitionOrder, head_locked_at, lock_heads
from store.model import KeyClaimLost
from store.partitions import scheme_of

T = TypeVar("T")

KNOWN_CALLS = 65536

MAX_BATCH = 64
"""Writes committed together at most: bounds how long the head lock is held by one transaction."""

ORDER_ATTEMPTS = 8
"""Times a transaction starts again to take the log heads it needs in order (store.log.PartitionOrder):
each start takes every head the last one found it needs, so this bounds the partitions one batch of
writes can touch in an unlucky order, not the writes."""
GATHER_S = 0.002
"""How long, at most, a transaction that expects company waits for it before it begins, in a process
whose calls do not announce themselves (store.coming)."""

COMING_S = 0.025
"""How long, at most, a transaction waits for the calls of the process that are coming (store.coming)."""

RETRYABLE = (exc.IntegrityError, KeyClaimLost)
"""A unique-key conflict means a concurrent claim won; run again, the write sees it and joins."""


class HeadHolds:
    """How long committed transactions held the log heads: from the first head lock to the end of COMMIT.

    The probe behind the partitions' arithmetic (bench/partitions.py): one partition's writers commit
    at most 1 / (mean hold) transactions a second, whatever the number of replicas.
    """

    KEPT = 8192

    def __init__(self) -> None:
        self.count = 0
        self.total_s = 0.0
        self.recent: deque[float] = deque(maxlen=self.KEPT)

    def add(self, held_s: float) -> None:
        self.count += 1
        self.total_s += held_s
        self.recent.append(held_s)


@dataclass(eq=False)
class _Job(Generic[T]):
    work: Callable[[Connection], T]
    retry: bool
    heads: frozenset[str] = frozenset()
    future: Future[T] = field(default_factory=Future)


class GroupWriter:
    """The process's one writer of a store's engine (see the module's docstring)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        # SQLite: the writer keeps one connection for its life, so its page cache stays warm from one
        # transaction to the next (a pooled one would often be another, cold, connection). PostgreSQL:
        # from the pool, which checks a connection that sat idle, and replaces a lost one.
        self._hold = engine.dialect.name == "sqlite"
        self._conn: Connection | None = None
        self.arrivals = Arrivals()
        """The calls of the process on their way to a commit; its condition guards `_queue` too."""
        self._queue: deque[_Job[Any] | None] = deque()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._local = threading.local()
        self._expected = 1
        """Writes the last transaction served and found queued after it: how many the next may wait for."""
        self.waits = 0
        """Transactions that waited for company before they began (never one of a lone client)."""
        self.batches = 0
        """Transactions committed (or tried) so far: with `writes`, how much was grouped."""
        self.writes = 0
        self.reorders = 0
        """Transactions started again to take the log heads in order (several partitions only)."""
        self.head_holds = HeadHolds()
        """The head-lock hold time of each transaction this writer committed."""
        self.call_heads: dict[str, str] = {}
        """The partition of calls this process admitted (the newest `KNOWN_CALLS`): a hint for their
        later writes, so they take their head before they run (store.Store)."""
        self._locked_at: float | None = None

    def run(
        self, work: Callable[[Connection], T], *, retry: bool = False, heads: frozenset[str] = frozenset()
    ) -> T:
        """Run `work` in the next group transaction; return its result once that has committed.

        `retry`: run it once more (in the same transaction) if it lost a unique-key race. `heads`: the
        log partitions it will append to, if known: their heads are taken, in order, before it runs
        (otherwise a write to a partition whose head it did not hold runs again, see store.log).

        Raises:
            whatever `work` raised (its own statements rolled back), or what the COMMIT raised.
        """
        conn: Connection | None = getattr(self._local, "conn", None)
        if conn is not None:  # a write inside a write, on the writer's own thread
            return self._savepointed(conn, _Job(work, retry))
        coming = current()
        future = self._submit(work, retry, heads, coming)
        try:
            return future.result()
        finally:
            if coming is not None:
                coming.answered()

    async def run_async(
        self, work: Callable[[Connection], T], *, retry: bool = False, heads: frozenset[str] = frozenset()
    ) -> T:
        """`run` for a caller on an event loop: it waits for the commit without holding a thread.

        Cancelling the caller waits for the write to finish first, as a write run in a worker thread
        (`anyio.to_thread`) does: what was recorded is not left half-heard.
        """
        import anyio.to_thread

        try:
            asyncio.get_running_loop()
        except RuntimeError:  # another event loop (trio): wait in a worker thread
            return await anyio.to_thread.run_sync(functools.partial(self.run, work, retry=retry, heads=heads))
        coming = current()
        future = self._submit(work, retry, heads, coming)
        try:
            with anyio.CancelScope(shield=True):
                result = await asyncio.wrap_future(future)
        finally:
            if coming is not None:
                coming.answered()
        return result

    def _submit(
        self, work: Callable[[Connection], T], retry: bool, heads: frozenset[str], coming: Coming | None
    ) -> Future[T]:
        job: _Job[T] = _Job(work, retry, heads)
        self._ensure_started()
        if coming is None:
            self._put(job)
        else:  # queued and no longer coming, in one step: the writer never waits for a write it holds
            coming.submitted(lambda: self._put(job))
        return job.future

    def _put(self, job: _Job[Any] | None) -> None:
        with self.arrivals.condition:
            self._queue.append(job)
            self.arrivals.condition.notify_all()

    def coming(self, commits: int) -> Coming:
        """Announce a call of this process that will make at most `commits` writes (store.coming)."""
        return Coming(self.arrivals, commits)

    def pending(self) -> int:
        """Writes queued for the next transaction (not the one being committed)."""
        with self.arrivals.condition:
            return sum(job is not None for job in self._queue)

    def close(self) -> None:
        """Let the queued writes commit, then stop the writer thread (a later write starts another)."""
        with self._lock:  # held throughout, so no second writer starts before this one has stopped
            thread = self._thread
            if thread is not None and self._pid == os.getpid():
                self._put(None)
                thread.join()
            self._thread = None

    def _ensure_started(self) -> None:
        if self._thread is not None and self._pid == os.getpid():
            return
        with self._lock:
            if self._pid != os.getpid():  # forked: the parent's thread, queue and connection are not ours
                self._pid, self._queue, self._thread, self._conn = (os.getpid(), deque(), None, None)
                self.arrivals = Arrivals(self.arrivals.clock)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="writ-store-writer", daemon=True)
                self._thread.start()

    def _loop(self) -> None:
        try:
            self._serve()
        finally:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    @contextmanager
    def _begin(self) -> Iterator[Connection]:
        if not self._hold:
            with self._engine.begin() as conn:
                yield conn
            return
        if self._conn is None or self._conn.closed or self._conn.invalidated:
            if self._conn is not None:
                self._conn.close()
            self._conn = self._engine.connect()
        with self._conn.begin():
            yield self._conn

    def _serve(self) -> None:
        while True:
            with self.arrivals.condition:
                while not self._queue:
                    self.arrivals.condition.wait()
                first = self._queue.popleft()
                if first is None:
                    stop = True
                    batch: list[_Job[Any]] = []
                else:
                    batch = [first]
                    stop = self._gather(batch)
            if batch:
                served = self._commit(batch)
                self._expected = min(MAX_BATCH, served + len(self._queue))
            if stop:
                self._drain()
                return

    def _gather(self, batch: list[_Job[Any]]) -> bool:
        """Add what is queued to `batch`, waiting a moment for the company expected; True: stop.

        Called under the arrivals' condition. When the process's calls announce themselves, wait while
        any of those awaited when the wait began (coming, or away and due back within the bound) is
        still coming or due (not for calls that set out meanwhile: they go in the next transaction), at
        most `COMING_S`; otherwise, for as many writes as the last transaction served and found queued,
        at most `GATHER_S`.
        """
        arrivals = self.arrivals
        deadline: float | None = None
        waited = False
        awaited: set[Coming] | None = None  # the calls awaited when the wait began: not later ones
        while len(batch) < MAX_BATCH:
            if self._queue:
                more = self._queue.popleft()
                if more is None:
                    return True
                batch.append(more)
                continue
            now = arrivals.clock()
            wake = deadline
            if arrivals.announced:
                if deadline is None:
                    deadline = now + COMING_S
                awaitable = arrivals.awaitable(now, deadline)
                awaited = awaitable if awaited is None else awaited & awaitable
                if not awaited:
                    return False
                wake = min(deadline, arrivals.late_at(awaited))  # then, one awaited may have turned late
            elif len(batch) >= self._expected:
                return False
            elif deadline is None:
                deadline = wake = now + GATHER_S
            assert deadline is not None and wake is not None
            if now >= deadline:
                return False
            if not waited:
                waited = True
                self.waits += 1
            arrivals.watched = True
            try:
                arrivals.condition.wait(max(0.0, wake - now))
            finally:
                arrivals.watched = False
        return False

    def _drain(self) -> None:
        # Writes queued behind the stop, by callers that found the writer still running: commit them.
        while True:
            with self.arrivals.condition:
                if not self._queue:
                    return
                late = self._queue.popleft()
            if late is not None:
                self._commit([late])

    def _commit(self, batch: list[_Job[Any]]) -> int:
        """Commit `batch` in one transaction, with the writes that join it as it runs; return how many
        writes it served."""
        if len(batch) == 1:
            self._alone(batch[0])
            return 1
        self.batches += 1
        self.writes += len(batch)
        prelock: frozenset[str] = frozenset().union(*(job.heads for job in batch))
        unordered: PartitionOrder | None = None
        for _ in range(ORDER_ATTEMPTS):
            done: list[tuple[_Job[Any], Any]] = []
            failed: list[tuple[_Job[Any], BaseException]] = []
            joined: list[_Job[Any]] = []
            try:
                with self._begin() as conn, self._in_batch(conn):
                    lock_heads(conn, prelock)
                    for job in batch:
                        self._run_one(conn, job, done, failed)
                    self._join(conn, prelock, len(batch), joined, done, failed)
            except PartitionOrder as order:  # nothing committed, nobody joined: again, every head in order
                prelock |= order.partitions
                unordered = order
                self.reorders += 1
                continue
            except BaseException as error:  # the COMMIT (or the connection) failed: nothing is durable
                self._fail(batch + joined, error)
                if not isinstance(error, Exception):
                    raise
            else:
                self._committed()
                for job, result in done:
                    job.future.set_result(result)
                for job, refused in failed:
                    job.future.set_exception(refused)
            self.writes += len(joined)
            return len(batch) + len(joined)
        assert unordered is not None
        self._fail(batch, unordered)
        return len(batch)

    def _run_one(
        self,
        conn: Connection,
        job: _Job[Any],
        done: list[tuple[_Job[Any], Any]],
        failed: list[tuple[_Job[Any], BaseException]],
    ) -> None:
        """Run `job` in a savepoint of the open transaction: its result goes to `done`, its refusal or
        failure to `failed` (each delivered to its caller after the COMMIT). Raises `PartitionOrder`
        (its statements rolled back), and what ends the transaction (a lost connection)."""
        try:
            done.append((job, self._savepointed(conn, job)))
        except PartitionOrder:
            raise
        except Exception as error:  # noqa: BLE001 (delivered to its caller, after the commit)
            if conn.invalidated:
                raise
            failed.append((job, error))

    def _join(
        self,
        conn: Connection,
        held: frozenset[str],
        served: int,
        joined: list[_Job[Any]],
        done: list[tuple[_Job[Any], Any]],
        failed: list[tuple[_Job[Any], BaseException]],
    ) -> None:
        """Run in the open transaction, each in a savepoint, the writes queued meanwhile whose heads it
        holds (`_take_joiners`), until none is left or it has served `MAX_BATCH`; they are answered with
        the batch, after its COMMIT.

        A joined write that turns out to need a head the transaction cannot take in order goes back to
        the front of the queue, with that head to take first next time: it runs in the next transaction
        and is answered once, from there. This raises only what ends the transaction (a lost connection),
        and `joined` then holds every write taken, so each hears that failure.
        """
        single = scheme_of(self._engine).single
        put_back: list[_Job[Any]] = []
        try:
            while served + len(joined) < MAX_BATCH:
                with self.arrivals.condition:
                    taken = self._take_joiners(single, held, MAX_BATCH - served - len(joined))
                if not taken:
                    return
                joined.extend(taken)
                for job in taken:
                    try:
                        self._run_one(conn, job, done, failed)
                    except PartitionOrder as order:  # rolled back, never answered: the next transaction's
                        job.heads |= order.partitions
                        joined.remove(job)
                        put_back.append(job)
        finally:
            if put_back:
                with self.arrivals.condition:
                    self._queue.extendleft(reversed(put_back))

    def _take_joiners(self, single: bool, held: frozenset[str], room: int) -> list[_Job[Any]]:
        # Under the arrivals' condition. Up to a stop (None): what was queued after it waits for it, and
        # the writes left behind keep their order.
        taken: list[_Job[Any]] = []
        left: list[_Job[Any]] = []
        while self._queue and len(taken) < room:
            job = self._queue[0]
            if job is None:
                break
            self._queue.popleft()
            if single or (job.heads and job.heads <= held):
                taken.append(job)
            else:  # unknown heads, or heads not held: taking them now could break the order of heads
                left.append(job)
        self._queue.extendleft(reversed(left))
        return taken

    @staticmethod
    def _fail(batch: list[_Job[Any]], error: BaseException) -> None:
        for job in batch:
            if not job.future.done():
                job.future.set_exception(error)

    def _alone(self, job: _Job[Any]) -> None:
        # One write, one transaction, exactly as without group commit: its error rolls it all back.
        self.batches += 1
        self.writes += 1
        prelock: frozenset[str] = job.heads
        unordered: PartitionOrder | None = None
        retried = False
        for _ in range(ORDER_ATTEMPTS + 1):
            try:
                with self._begin() as conn, self._in_batch(conn):
                    lock_heads(conn, prelock)
                    result = job.work(conn)
            except PartitionOrder as order:
                prelock |= order.partitions
                unordered = order
                self.reorders += 1
                continue
            except RETRYABLE as lost:
                if job.retry and not retried:
                    retried = True
                    continue
                job.future.set_exception(lost)
                return
            except BaseException as error:
                job.future.set_exception(error)
                if not isinstance(error, Exception):
                    raise
                return
            self._committed()
            job.future.set_result(result)
            return
        assert unordered is not None
        job.future.set_exception(unordered)

    def _savepointed(self, conn: Connection, job: _Job[T]) -> T:
        retried = False
        for _ in range(ORDER_ATTEMPTS + 2):
            try:
                with conn.begin_nested():
                    return job.work(conn)
            except PartitionOrder as order:
                # Its statements are rolled back: take the heads it needs (if that can be done without
                # waiting out of order) and run it again under them; else the transaction starts again.
                lock_heads(conn, order.partitions)
                self.reorders += 1
            except RETRYABLE:
                if not job.retry or retried or conn.invalidated:
                    raise
                retried = True
        raise PartitionOrder(frozenset())

    @contextmanager
    def _in_batch(self, conn: Connection) -> Iterator[None]:
        self._local.conn = conn
        self._locked_at = None
        try:
            yield
            self._locked_at = head_locked_at(conn)  # the COMMIT follows, as this context ends
        finally:
            self._local.conn = None

    def _committed(self) -> None:
        if self._locked_at is not None:
            self.head_holds.add(time.perf_counter() - self._locked_at)
