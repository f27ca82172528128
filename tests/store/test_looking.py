"""A read's look before it runs, from an event loop: the same answer as in a worker thread, seeing what
other processes committed, never handed to a worker thread, and on PostgreSQL never blocking the loop
while the server answers (store.looking)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import anyio
import anyio.to_thread
import pytest
from psycopg import pq
from sqlalchemy import Connection, create_engine, exc, text

from store import Store
from store.commands import RevokePrincipal
from store.db import LOOK_CONNECTIONS, LookOptions, normalize_url
from store.looking import LoopLooks
from store.model import StoreError
from tests.handoffs import hand_offs
from tests.store.builders import NOW
from tests.store.test_read_records import read_request

pytestmark = pytest.mark.anyio


async def test_the_look_from_the_loop_answers_as_the_look_in_a_thread_and_sees_another_process_revoke(
    store: Store, migrated_url: str
) -> None:
    request = read_request()
    assert await store.admissible_read_async(request) is store.admissible_read(request) is True

    # Another process (its own engine) revokes: the connection the loop keeps must not hold an old view.
    with Store.open(migrated_url) as other:
        other.revoke_principal(RevokePrincipal("acme", "alice", revoked_by="root", now=NOW))

    assert await store.admissible_read_async(request) is store.admissible_read(request) is False


async def test_the_look_is_never_handed_to_a_worker_thread(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    handed = hand_offs(monkeypatch)
    assert await store.admissible_read_async(read_request())
    assert await store.admissible_read_async(read_request(2))
    assert handed == []


async def test_a_store_whose_faces_record_as_others_looks_without_the_pool_of_its_writes(
    store: Store,
) -> None:
    face = store.with_producer("writ-console")
    await store.admissible_read_async(read_request())
    checked_out = store.engine.pool.checkedout()  # type: ignore[attr-defined]
    await face.admissible_read_async(read_request(2))
    # SQLite: the loop's own kept connection; PostgreSQL: the loop's asyncio engine. Neither waits on
    # the pool that the writer's and worker threads' transactions use.
    assert store.engine.pool.checkedout() == checked_out  # type: ignore[attr-defined]


async def test_a_look_after_the_store_closed_is_refused(store: Store) -> None:
    assert await store.admissible_read_async(read_request())
    store.close()
    with pytest.raises(StoreError, match="closed"):
        await store.admissible_read_async(read_request())


# -- PostgreSQL: awaited on the loop ----------------------------------------------------------------


@pytest.fixture
def loop_looks(postgres_url: str) -> Iterator[LoopLooks]:

    engine = create_engine(normalize_url(postgres_url))
    looks = LoopLooks(engine, LookOptions())
    try:
        yield looks
    finally:
        looks.close()
        engine.dispose()


def _backend_pid(conn: Connection) -> int:
    return int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())


def _terminate(postgres_url: str, pid: int) -> None:

    engine = create_engine(normalize_url(postgres_url))
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
            conn.commit()
    finally:
        engine.dispose()


def _sessions(postgres_url: str, *pids: int, settle_s: float = 0.0) -> set[int]:
    """Which of `pids` the server still has, after waiting up to `settle_s` for any of them to go."""

    engine = create_engine(normalize_url(postgres_url))
    query = text("SELECT pid FROM pg_stat_activity WHERE pid = ANY(:pids)")
    try:
        deadline = time.monotonic() + settle_s
        while True:
            with engine.connect() as conn:
                alive = {int(pid) for pid in conn.execute(query, {"pids": list(pids)}).scalars()}
            if alive != set(pids) or time.monotonic() >= deadline:
                return alive
            time.sleep(0.05)
    finally:
        engine.dispose()


async def test_the_loop_goes_on_while_postgresql_takes_its_time_to_answer_a_look(
    loop_looks: LoopLooks,
) -> None:
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await anyio.sleep(0.01)
            ticks += 1

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(tick)
        await loop_looks.run(lambda conn: conn.execute(text("SELECT pg_sleep(0.5)")))
        tasks.cancel_scope.cancel()
    # A look made synchronously on the loop would have let no tick run until the server answered.
    assert ticks >= 10


async def test_a_look_sends_its_statements_alone_without_begin_or_commit(loop_looks: LoopLooks) -> None:
    def status_after_a_statement(conn: Connection) -> pq.TransactionStatus:
        conn.execute(text("SELECT 1"))
        return conn.connection.driver_connection.info.transaction_status  # type: ignore[union-attr]

    # In a transaction it would be INTRANS, its BEGIN a round trip before the statement and its COMMIT one
    # after; under READ COMMITTED a statement sees its own snapshot either way.
    assert await loop_looks.run(status_after_a_statement) == pq.TransactionStatus.IDLE


async def test_a_look_cancelled_while_the_server_works_leaves_the_next_look_whole(
    loop_looks: LoopLooks,
) -> None:
    with anyio.move_on_after(0.2) as scope:
        await loop_looks.run(lambda conn: conn.execute(text("SELECT pg_sleep(5)")))
    assert scope.cancelled_caught
    # Not the cancelled statement's result, nor an error from a connection left busy with it.
    assert await loop_looks.run(lambda conn: conn.execute(text("SELECT 41 + 1")).scalar_one()) == 42


async def test_a_session_the_server_ended_fails_one_look_and_the_next_look_reconnects(
    loop_looks: LoopLooks, postgres_url: str
) -> None:

    pid = await loop_looks.run(_backend_pid)
    _terminate(postgres_url, pid)
    # Used a moment ago, it is not pinged (as the pool would not): the failure is the caller's.
    with pytest.raises(exc.OperationalError):  # the store translates it as Unavailable
        await loop_looks.run(_backend_pid)
    assert await loop_looks.run(_backend_pid) != pid


async def test_a_kept_session_the_server_ended_while_it_sat_unused_is_replaced_unseen(
    postgres_url: str,
) -> None:

    engine = create_engine(normalize_url(postgres_url))
    looks = LoopLooks(engine, LookOptions(ping_after_idle_s=0.0))  # every kept session counts as idle
    try:
        pid = await looks.run(_backend_pid)
        _terminate(postgres_url, pid)
        # As the pool pings a connection that sat unused before handing it out: the look is made again
        # on a new session, once, and answers.
        assert await looks.run(_backend_pid) != pid
    finally:
        await anyio.to_thread.run_sync(looks.close)
        engine.dispose()


def test_closing_after_the_loop_is_gone_closes_the_looks_sessions(postgres_url: str) -> None:

    engine = create_engine(normalize_url(postgres_url))
    looks = LoopLooks(engine, LookOptions())
    try:
        pid = asyncio.run(looks.run(_backend_pid))
        assert _sessions(postgres_url, pid) == {pid}
        looks.close()  # no loop runs now: the test suite turns an unclosed connection into an error
        assert _sessions(postgres_url, pid, settle_s=10) == set()
    finally:
        looks.close()
        engine.dispose()


def test_the_engine_of_a_loop_that_closed_is_disposed_when_the_next_loop_looks(
    loop_looks: LoopLooks, postgres_url: str
) -> None:
    first = asyncio.run(loop_looks.run(_backend_pid))
    second = asyncio.run(loop_looks.run(_backend_pid))
    assert second != first  # a loop's pool is its own
    # A process that runs one loop after another (tests, CLI commands) keeps one loop's sessions open.
    assert _sessions(postgres_url, first, second, settle_s=10) == {second}


async def test_many_looks_at_once_share_a_few_connections_and_all_answer(loop_looks: LoopLooks) -> None:
    pids: list[int] = []

    def slow_look(conn: Connection) -> int:
        conn.execute(text("SELECT pg_sleep(0.05)"))
        return _backend_pid(conn)

    async def look() -> None:
        pids.append(await loop_looks.run(slow_look))

    async with anyio.create_task_group() as tasks:
        for _ in range(3 * LOOK_CONNECTIONS):
            tasks.start_soon(look)
    assert len(pids) == 3 * LOOK_CONNECTIONS
    # The rest waited on the loop for a connection: replicas x this bound is what the docs budget.
    assert 1 < len(set(pids)) <= LOOK_CONNECTIONS
