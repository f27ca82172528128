"""Appending to the log: however many events one transaction appends, they read back as sealed and the head
follows them (on PostgreSQL, while psycopg caches the statement, in one statement with the head's move)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlalchemy import Connection, exc, insert, select

from store import Store
from store import events as ev
from store.log import Append
from store.schema import events
from tests.store.builders import NOW, call_request, new_id


def _run_started(run_id: str) -> ev.Event:
    return ev.RunStartedEvent(
        occurred_at=ev.format_ts(NOW),
        producer="test",
        run_id=run_id,
        tenant="acme",
        payload=ev.RunStarted(tenant="acme", subject="agent-1"),
    )


def _appending(count: int) -> Callable[[Connection], list[ev.Event]]:
    """A write that appends `count` events in one transaction and returns them sealed."""
    runs = [_run_started(new_id("run")) for _ in range(count)]

    def work(conn: Connection) -> list[ev.Event]:
        log = Append(conn)
        sealed = [log.add(event) for event in runs]
        log.flush()
        return sealed

    return work


def _stored(sealed: list[ev.Event]) -> list[tuple[object, ...]]:
    return [
        (e.seq, e.event_id, e.type, e.occurred_at, e.payload.model_dump(mode="json"), e.hash) for e in sealed
    ]


@pytest.mark.parametrize("count", [1, 2, 3, 9])
def test_the_events_of_one_append_read_back_as_sealed_and_the_head_follows_them(
    store: Store, count: int
) -> None:
    store.admit(call_request(idempotency_key=new_id("key")))  # a log that does not start empty
    sealed = store.writer.run(_appending(count))

    stored = store.events()[-count:]
    assert [(e.seq, e.event_id, e.type, e.occurred_at, e.payload, e.hash) for e in stored] == _stored(sealed)
    assert store.log_head() == (sealed[-1].seq, sealed[-1].hash)
    assert store.verify().ok


def test_an_append_whose_events_clash_fails_as_a_unique_violation_and_moves_no_head(store: Store) -> None:
    store.admit(call_request(idempotency_key=new_id("key")))
    head = store.log_head()
    work = _appending(2)

    def clashing(conn: Connection) -> None:
        taken = conn.execute(select(events).where(events.c.seq == head[0])).one()._asdict()
        conn.execute(insert(events).values(taken | {"seq": head[0] + 2, "pseq": head[0] + 2}))
        work(conn)  # its second event's seq is taken

    with pytest.raises(exc.IntegrityError):
        store.writer.run(clashing)

    assert store.log_head() == head
    assert store.writer.run(work)[-1].seq == head[0] + 2
    assert store.verify().ok
