"""Group commit: the writes queued while a transaction commits are committed together, those queued
while a group transaction runs join it when it holds their heads, and one write's refusal or failure
is its own."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import anyio
import pytest
from sqlalchemy import Connection, event, select

from store import StaleLease, Store
from store import events as ev
from store.log import Append, lock_head
from store.partitions import Partitioning, configure
from store.schema import events
from tests.store.builders import NOW, call_request, outcome

LATER = NOW + timedelta(seconds=2)


@contextmanager
def writer_held(store: Store) -> Iterator[Callable[[Callable[[], Any]], Future[Any]]]:
    """Occupy the store's writer with a write that waits, so that the writes submitted meanwhile queue
    up; on leaving, release it and let the queue commit as one transaction."""
    release, inside = threading.Event(), threading.Event()

    def hold(conn: Connection) -> None:
        inside.set()
        release.wait(30)

    with ThreadPoolExecutor(8) as pool:
        holder = pool.submit(store.writer.run, hold)
        assert inside.wait(30)
        submitted: list[Future[Any]] = []

        def submit(write: Callable[[], Any]) -> Future[Any]:
            submitted.append(pool.submit(write))
            return submitted[-1]

        try:
            yield submit
            with anyio.from_thread.start_blocking_portal() as portal:
                portal.call(_until_queued, store, len(submitted))
        finally:
            release.set()
        holder.result(30)


async def _until_queued(store: Store, count: int) -> None:
    with anyio.fail_after(30):
        while store.writer.pending() < count:
            await anyio.sleep(0.01)


def group_joined_by(
    store: Store, members: list[Callable[[], Any]], joiners: list[Callable[[], Any]]
) -> tuple[int, list[Future[Any]], list[Future[Any]]]:
    """Commit `members` as one group transaction, held open by a write of its own until every one of
    `joiners` has been queued behind it; return the transaction's number (`GroupWriter.batches`) and
    the futures of the members and of the joiners."""
    writer = store.writer
    running = threading.Event()
    group: list[int] = []

    def keep_open(conn: Connection) -> None:
        group.append(writer.batches)
        running.set()
        with writer.arrivals.condition:
            assert writer.arrivals.condition.wait_for(lambda: writer.pending() >= len(joiners), 30)

    with ThreadPoolExecutor(len(joiners)) as joining, ThreadPoolExecutor(1) as starter:

        def join_once_running() -> list[Future[Any]]:
            assert running.wait(30)
            return [joining.submit(joiner) for joiner in joiners]

        joined = starter.submit(join_once_running)
        with writer_held(store) as submit:
            grouped = [submit(lambda: writer.run(keep_open))] + [submit(member) for member in members]
        for future in grouped:
            future.exception(30)
        later = joined.result(30)
        for future in later:
            future.exception(30)
    return group[0], grouped[1:], later


def test_writes_queued_behind_a_commit_are_committed_together(store: Store) -> None:
    before = store.writer.batches
    with writer_held(store) as submit:
        admitted = [
            submit(lambda i=i: store.admit(call_request(tool_call_id=f"tc-{i}", idempotency_key=f"k-{i}")))
            for i in range(5)
        ]

    assert [f.result().call.status for f in admitted] == ["dispatching"] * 5
    assert store.writer.batches - before == 2  # the held write, then the five together
    assert store.verify().ok
    assert {e.tool_call_id for e in store.events() if e.type == "tool_call.requested"} == {
        f"tc-{i}" for i in range(5)
    }


def test_a_refused_write_in_a_group_fails_alone(store: Store) -> None:
    store.admit(call_request(tool_call_id="tc-done", idempotency_key="k-tc-done"))
    store.record_outcome(outcome("tc-done", "completed", now=LATER))
    store.admit(call_request(tool_call_id="tc-open", idempotency_key="k-tc-open"))

    with writer_held(store) as submit:
        first = submit(lambda: store.admit(call_request(tool_call_id="tc-a", idempotency_key="k-tc-a")))
        stale = submit(lambda: store.record_outcome(outcome("tc-done", "failed", now=LATER)))
        settled = submit(lambda: store.record_outcome(outcome("tc-open", "completed", now=LATER)))
        last = submit(lambda: store.admit(call_request(tool_call_id="tc-b", idempotency_key="k-tc-b")))

    with pytest.raises(StaleLease, match="completed, not dispatching"):
        stale.result()
    assert first.result().call.status == last.result().call.status == "dispatching"
    assert settled.result().status == "completed"
    assert store.get_call("tc-done").status == "completed"  # type: ignore[union-attr]
    assert [e.type for e in store.events(tool_call_id="tc-done")][-1] == "tool_call.completed"
    assert store.verify().ok


def test_two_claims_of_one_key_in_a_group_join_instead_of_failing(store: Store) -> None:
    with writer_held(store) as submit:
        calls = [
            submit(lambda i=i: store.admit(call_request(tool_call_id=f"tc-{i}", idempotency_key="k-1")))
            for i in range(3)
        ]

    kinds = sorted(f.result().kind for f in calls)
    assert kinds == ["joined", "joined", "new"]
    holders = {f.result().call.tool_call_id for f in calls}
    assert len(holders) == 1
    assert store.verify().ok


def test_a_write_inside_a_write_joins_its_transaction(store: Store) -> None:
    def outer(conn: Connection) -> str:
        return store.writer.run(lambda inner: "inner ran") + " inside"

    assert store.writer.run(outer) == "inner ran inside"


@pytest.mark.anyio
async def test_a_write_awaited_on_the_event_loop_is_committed_when_it_is_heard(store: Store) -> None:
    admission = await store.admit_async(call_request(tool_call_id="tc-1", idempotency_key="k-1"))
    recorded = await store.record_outcome_async(outcome("tc-1", "completed", now=LATER))

    assert admission.call.status == "dispatching"
    assert recorded.status == store.get_call("tc-1").status == "completed"  # type: ignore[union-attr]
    with pytest.raises(StaleLease, match="completed, not dispatching"):
        await store.record_outcome_async(outcome("tc-1", "failed", now=LATER))


@pytest.mark.anyio
async def test_a_cancelled_caller_waits_for_its_write_to_commit_before_it_stops(store: Store) -> None:
    release, inside = threading.Event(), threading.Event()

    def hold(conn: Connection) -> None:
        inside.set()
        release.wait(30)

    heard: list[str] = []

    async def caller(scope: anyio.CancelScope) -> None:
        with scope:
            admission = await store.admit_async(call_request(tool_call_id="tc-1", idempotency_key="k-1"))
            heard.append(admission.call.status)
            await anyio.sleep(0)  # the cancellation is delivered here, after the write
            heard.append("not cancelled")

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(anyio.to_thread.run_sync, lambda: store.writer.run(hold))
            await anyio.to_thread.run_sync(inside.wait)
            scope = anyio.CancelScope()
            tg.start_soon(caller, scope)
            await _until_queued(store, 1)
            scope.cancel()
            release.set()

    assert heard == ["dispatching"]
    assert store.get_call("tc-1").status == "dispatching"  # type: ignore[union-attr]


def test_a_store_closed_and_written_again_starts_a_new_writer(migrated_url: str) -> None:
    with Store.open(migrated_url) as store:
        store.admit(call_request(tool_call_id="tc-1", idempotency_key="k-1"))
        store.writer.close()
        store.writer.close()  # closing twice is harmless
        again = store.admit(call_request(tool_call_id="tc-2", idempotency_key="k-2"))

    assert again.call.status == "dispatching"
    with Store.open(migrated_url) as reopened:
        assert reopened.get_call("tc-2") is not None


def test_a_lone_client_s_writes_never_wait_for_company(store: Store) -> None:
    for i in range(5):
        req = call_request(tool_call_id=f"tc-{i}", idempotency_key=f"k-{i}")
        token = store.admit(req).call.lease_token
        store.record_outcome(outcome(f"tc-{i}", "completed", token=token, now=LATER))
    assert store.writer.waits == 0


def test_only_a_transaction_after_one_with_company_waits_for_more(store: Store) -> None:
    with writer_held(store) as submit:
        admitted = [
            submit(lambda i=i: store.admit(call_request(tool_call_id=f"tc-{i}", idempotency_key=f"k-{i}")))
            for i in range(3)
        ]
    assert [f.result().call.status for f in admitted] == ["dispatching"] * 3
    assert store.writer.waits == 1  # the three were queued behind the held write: company expected
    store.admit(call_request(tool_call_id="tc-alone", idempotency_key="k-alone"))
    assert store.writer.waits == 2  # after the three, it waited (at most GATHER_S); none came
    store.admit(call_request(tool_call_id="tc-alone-2", idempotency_key="k-alone-2"))
    assert store.writer.waits == 2  # the last had no company: no wait


def test_a_write_queued_while_a_group_commits_joins_it_and_hears_only_after_its_commit(store: Store) -> None:
    heard = threading.Event()
    heard_before_commit: list[bool] = []
    group_batch = store.writer.batches + 2  # after the write that holds the writer

    def on_commit(conn: Connection) -> None:  # as the writer's COMMIT is about to be sent
        if threading.current_thread().name == "writ-store-writer" and store.writer.batches == group_batch:
            heard_before_commit.append(heard.wait(0.2))

    def joiner() -> str:
        status = store.admit(call_request(tool_call_id="tc-3", idempotency_key="k-3")).call.status
        heard.set()
        return status

    writes = store.writer.writes
    event.listen(store.engine, "commit", on_commit)
    try:
        group, members, joined = group_joined_by(
            store, [lambda: store.admit(call_request(tool_call_id="tc-1", idempotency_key="k-1"))], [joiner]
        )
    finally:
        event.remove(store.engine, "commit", on_commit)

    assert group == group_batch
    assert (store.writer.batches, store.writer.writes - writes) == (group, 4)  # held, then 3 in one
    assert members[0].result().call.status == joined[0].result() == "dispatching"
    assert heard_before_commit == [False]
    assert store.verify().ok


def test_a_queued_write_joins_a_group_only_if_it_holds_the_write_s_heads(store: Store) -> None:
    configure(store.engine, Partitioning("tenant"))

    def in_batch(heads: frozenset[str]) -> Callable[[], int]:
        return lambda: store.writer.run(lambda conn: store.writer.batches, heads=heads)

    acme = call_request(tool_call_id="tc-a1", idempotency_key="k-a1")  # its heads: t:acme
    group, _, joined = group_joined_by(
        store,
        [lambda: store.admit(acme)],
        [in_batch(frozenset({"t:acme"})), in_batch(frozenset({"t:globex"})), in_batch(frozenset())],
    )

    held, other, unknown = (future.result() for future in joined)
    assert held == group
    assert other > group and unknown > group  # each in a later transaction
    assert store.get_call("tc-a1").status == "dispatching"  # type: ignore[union-attr]
    assert store.verify().ok


def test_a_write_that_joins_a_group_and_is_refused_hears_only_its_own_error(store: Store) -> None:
    store.admit(call_request(tool_call_id="tc-done", idempotency_key="k-tc-done"))
    store.record_outcome(outcome("tc-done", "completed", now=LATER))
    before = store.writer.batches

    group, members, (stale, last) = group_joined_by(
        store,
        [lambda: store.admit(call_request(tool_call_id="tc-a", idempotency_key="k-tc-a"))],
        [
            lambda: store.record_outcome(outcome("tc-done", "failed", now=LATER)),
            lambda: store.admit(call_request(tool_call_id="tc-b", idempotency_key="k-tc-b")),
        ],
    )

    assert store.writer.batches - before == 2  # the held write, then the group with both joiners
    with pytest.raises(StaleLease, match="completed, not dispatching"):
        stale.result()
    assert members[0].result().call.status == last.result().call.status == "dispatching"
    assert store.get_call("tc-done").status == "completed"  # type: ignore[union-attr]
    assert store.verify().ok


@pytest.mark.postgres
def test_a_joiner_that_needs_a_head_it_cannot_take_in_order_runs_once_in_a_later_transaction(
    pg_schema_url: str,
) -> None:
    with Store.open(pg_schema_url, partitioning=Partitioning("tenant")) as store:
        store.migrate()
        store.admit(call_request(tool_call_id="tc-a0", idempotency_key="k-a0"))  # t:acme's head exists
        acme_held, member_heard, joiner_heard = threading.Event(), threading.Event(), threading.Event()
        joiner_heard_while_acme_held: list[bool] = []
        runs: list[int] = []

        def hold_acme() -> None:  # another transaction holds t:acme's head until the group has committed
            with store.engine.connect() as other, other.begin():
                lock_head(other, "t:acme")
                acme_held.set()
                assert member_heard.wait(30)
                joiner_heard_while_acme_held.append(joiner_heard.is_set())

        def zeta_then_acme(conn: Connection) -> int:
            runs.append(store.writer.batches)
            for tenant in ("zeta", "acme"):  # its hint names t:zeta only: t:acme sorts below it
                log = Append(conn)
                log.add(
                    ev.RunStartedEvent(
                        occurred_at=ev.format_ts(NOW),
                        producer="test",
                        run_id=f"run-joiner-{tenant}",
                        tenant=tenant,
                        payload=ev.RunStarted(tenant=tenant, subject="agent-1"),
                    )
                )
                log.flush()
            return store.writer.batches

        def member() -> str:
            status = store.admit(
                call_request(tool_call_id="tc-z1", idempotency_key="k-z1", tenant="zeta", run_id="run-z")
            ).call.status
            member_heard.set()
            return status

        def joiner() -> int:
            batch = store.writer.run(zeta_then_acme, heads=frozenset({"t:zeta"}))
            joiner_heard.set()
            return batch

        with ThreadPoolExecutor(1) as holding:
            held = holding.submit(hold_acme)
            assert acme_held.wait(30)
            group, (admitted,), (joined,) = group_joined_by(store, [member], [joiner])
            held.result(30)

        assert admitted.result() == "dispatching"
        assert joiner_heard_while_acme_held == [False]  # the group committed without it
        assert runs[0] == group and joined.result() == runs[1] > group and len(runs) == 2
        with store.engine.connect() as conn:
            mine = conn.execute(
                select(events.c.partition).where(events.c.run_id.like("run-joiner-%")).order_by("partition")
            ).scalars()
            assert list(mine) == ["t:acme", "t:zeta"]  # once each: its first run was rolled back
        assert store.verify().ok
