"""The group writer waits for calls on their way to a commit (store.coming), and only for them.

The bound (`COMING_S`) is raised to 30 s here, so that a wait that should end when a call arrives,
leaves or turns late at its backend would show as a test stuck in `anyio.fail_after`, not pass by
running out its bound. What is due back from a backend, and when, is tested with an injected clock in
tests/store/test_away_times.py.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import anyio
import anyio.to_thread
import pytest

from store import Store, batching
from store.coming import away
from tests.store.builders import call_request

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def long_bound(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(batching, "COMING_S", 30.0)
    yield


def _admit(store: Store, i: int) -> str:
    return store.admit(call_request(tool_call_id=f"tc-{i}", idempotency_key=f"k-{i}")).call.status


async def _until(predicate: object) -> None:
    with anyio.fail_after(10):
        while not predicate():  # type: ignore[operator]
            await anyio.sleep(0.005)


async def test_an_announced_call_alone_in_the_process_never_waits(store: Store) -> None:
    for i in range(3):
        with store.coming(2):
            assert _admit(store, i) == "dispatching"
    assert store.writer.waits == 0
    assert len(store.writer.arrivals.coming) == 0


async def test_a_write_waits_for_a_call_on_its_way_and_both_commit_in_one_transaction(store: Store) -> None:
    other_may_write = threading.Event()

    def first() -> str:
        with store.coming(1):
            return _admit(store, 1)

    def second() -> str:
        with store.coming(1):  # on its way: the first's transaction waits for it
            other_may_write.wait(10)
            return _admit(store, 2)

    batches, writes = store.writer.batches, store.writer.writes
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(anyio.to_thread.run_sync, second)
            await _until(lambda: len(store.writer.arrivals.coming) == 1)
            tg.start_soon(anyio.to_thread.run_sync, first)
            await _until(lambda: store.writer.waits == 1)  # the first is held back for the second
            other_may_write.set()

    assert (store.writer.batches - batches, store.writer.writes - writes) == (1, 2)
    assert [store.get_call(f"tc-{i}").status for i in (1, 2)] == ["dispatching"] * 2  # type: ignore[union-attr]


async def test_a_call_that_sets_out_while_the_writer_waits_is_left_for_the_next_transaction(
    store: Store,
) -> None:
    second_may_write, latecomer_may_write = threading.Event(), threading.Event()

    def announced(i: int, go: threading.Event) -> str:
        with store.coming(1):
            go.wait(10)
            return _admit(store, i)

    batches, writes = store.writer.batches, store.writer.writes
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(anyio.to_thread.run_sync, announced, 2, second_may_write)
            await _until(lambda: len(store.writer.arrivals.coming) == 1)
            tg.start_soon(anyio.to_thread.run_sync, lambda: _admit(store, 1))
            await _until(lambda: store.writer.waits == 1)  # waiting for the second
            tg.start_soon(anyio.to_thread.run_sync, announced, 3, latecomer_may_write)
            await _until(lambda: len(store.writer.arrivals.coming) == 2)
            second_may_write.set()  # the first and second commit; the latecomer is not waited for
            await _until(lambda: store.get_call("tc-2") is not None)  # committed: none can join it now
            assert store.writer.writes - writes == 2
            assert store.get_call("tc-3") is None
            latecomer_may_write.set()

    assert store.writer.batches - batches == 2
    assert [store.get_call(f"tc-{i}").status for i in (1, 2, 3)] == ["dispatching"] * 3  # type: ignore[union-attr]


async def test_a_call_that_ends_without_writing_stops_being_waited_for(store: Store) -> None:
    leave = threading.Event()

    def passer_by() -> None:
        with store.coming(1):
            leave.wait(10)  # refused or joined: it ends without a write

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(anyio.to_thread.run_sync, passer_by)
            await _until(lambda: len(store.writer.arrivals.coming) == 1)
            tg.start_soon(anyio.to_thread.run_sync, lambda: _admit(store, 1))
            await _until(lambda: store.writer.waits == 1)
            leave.set()  # well before the 30 s bound: the write commits as the call leaves

    assert store.get_call("tc-1").status == "dispatching"  # type: ignore[union-attr]
    assert len(store.writer.arrivals.coming) == 0


async def test_a_call_with_a_write_left_is_coming_again_once_its_first_has_committed(store: Store) -> None:
    seen_by_writer: list[int] = []

    def write(conn: object) -> None:
        seen_by_writer.append(len(store.writer.arrivals.coming))

    with store.coming(1) as coming:
        coming.also(1)
        assert len(store.writer.arrivals.coming) == 1
        store.writer.run(write)
        assert len(store.writer.arrivals.coming) == 1  # its outcome is still to come
        store.writer.run(write)
        assert len(store.writer.arrivals.coming) == 0
    # While its own write was queued and committing, it was never waited for.
    assert seen_by_writer == [0, 0]
    assert store.writer.waits == 0


async def test_a_write_waits_for_a_call_due_back_from_its_backend_and_both_commit_together(
    store: Store,
) -> None:
    store.writer.arrivals.times.observe("usual-5s", 5.0)  # due back 5 s after it left, within the bound
    back = threading.Event()

    def at_backend() -> str:
        with store.coming(1):
            with away("usual-5s"):
                back.wait(10)
            return _admit(store, 2)

    batches, writes = store.writer.batches, store.writer.writes
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(anyio.to_thread.run_sync, at_backend)
            await _until(lambda: len(store.writer.arrivals.away) == 1)
            tg.start_soon(anyio.to_thread.run_sync, lambda: _admit(store, 1))
            await _until(lambda: store.writer.waits == 1)  # held back for the call due back
            back.set()

    assert (store.writer.batches - batches, store.writer.writes - writes) == (1, 2)
    assert not store.writer.arrivals.away


async def test_a_call_late_at_its_backend_stops_being_waited_for(store: Store) -> None:
    store.writer.arrivals.times.observe("usual-1s", 1.0)  # late 2 s after it left (1 s + twice its spread)
    back = threading.Event()

    def stuck() -> None:
        with store.coming(1), away("usual-1s"):
            back.wait(20)

    with anyio.fail_after(15):  # far below the 30 s bound: the wait ends as the call turns late
        async with anyio.create_task_group() as tg:
            tg.start_soon(anyio.to_thread.run_sync, stuck)
            await _until(lambda: len(store.writer.arrivals.away) == 1)
            assert await anyio.to_thread.run_sync(lambda: _admit(store, 1)) == "dispatching"
            assert store.writer.waits == 1
            back.set()
    # The stuck call's time came back, and it raised the backend's usual time.
    assert store.writer.arrivals.times.due("usual-1s", 0.0).back_at > 1.0  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("backend", "usual_s", "recorded_away"),
    [("never-seen", None, 0), ("usual-60s", 60.0, 1)],  # unknown; due back after the 30 s bound
)
async def test_a_call_at_a_backend_not_due_back_within_the_bound_is_not_waited_for(
    store: Store, backend: str, usual_s: float | None, recorded_away: int
) -> None:
    if usual_s is not None:
        store.writer.arrivals.times.observe(backend, usual_s)
    arrivals = store.writer.arrivals
    back = threading.Event()

    def at_backend() -> None:
        with store.coming(1), away(backend):
            back.wait(10)

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(anyio.to_thread.run_sync, at_backend)
            await _until(
                lambda: arrivals.announced and not arrivals.coming and len(arrivals.away) == recorded_away
            )
            await anyio.to_thread.run_sync(lambda: _admit(store, 1))
            assert store.writer.waits == 0
            back.set()


async def test_a_call_alone_that_goes_to_its_backend_between_its_writes_never_waits(store: Store) -> None:
    store.writer.arrivals.times.observe("backend", 5.0)  # a call away there is due back within the bound
    for i in range(4):
        with store.coming(1) as coming:
            coming.also(1)
            assert _admit(store, i) == "dispatching"
            with away("backend"):
                pass
            store.writer.run(lambda conn: None)  # its outcome
    assert store.writer.arrivals.times.due("backend", 0.0) is not None
    assert store.writer.waits == 0
    assert not store.writer.arrivals.away and not store.writer.arrivals.coming
