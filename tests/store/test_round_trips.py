"""The round trips a call's transactions make to PostgreSQL, counted (never timed), so that one more is seen.

Each counts what the client waits on (`bench/round_trips.py`): BEGIN, each statement, and the COMMIT.
Pipelining the writes whose results nobody reads (psycopg's pipeline mode) took them to 4, 4 and 6 on
a branch; it needed psycopg's private pipeline internals and lost a unique violation to "cannot exit
pipeline mode while busy" under load, so it was not kept.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from bench.round_trips import RoundTrips, count_round_trips
from store import OutcomeRecord, ReadRecord, Store
from tests.postgres import Snapshot
from tests.store.builders import call_request, new_id, outcome

pytestmark = pytest.mark.postgres


@pytest.fixture
def counted(migrated_postgres: Snapshot) -> Iterator[tuple[Store, RoundTrips]]:
    migrated_postgres.restore()
    with Store.open(migrated_postgres.url) as store:
        trips = count_round_trips(store.engine)
        store.admit(call_request(idempotency_key=new_id("warm")))  # a run's first call inserts its row
        yield store, trips


def test_an_admission_takes_eight_round_trips(counted: tuple[Store, RoundTrips]) -> None:
    store, trips = counted
    before = trips.total
    admission = store.admit(call_request(idempotency_key=new_id("key")))
    assert admission.call.status == "dispatching"
    # BEGIN; the head lock; what admit reads; the run counted; the key claimed; the call inserted;
    # its events inserted with the head moved (one statement); COMMIT.
    assert trips.total - before == 8


def test_an_outcome_takes_six_round_trips(counted: tuple[Store, RoundTrips]) -> None:
    store, trips = counted
    req = call_request(idempotency_key=new_id("key"))
    token = store.admit(req).call.lease_token
    before = trips.total
    store.record_outcome(outcome(req.identity.tool_call_id, "completed", token=token, now=req.identity.now))
    # BEGIN; the head lock; the call read; the call moved; its event inserted with the head moved;
    # COMMIT.
    assert trips.total - before == 6


def test_a_recorded_read_takes_eleven_round_trips(counted: tuple[Store, RoundTrips]) -> None:
    store, trips = counted
    req = dataclasses.replace(
        call_request(
            tool_name="lookup_order",
            effect_class="read",
            dedupe_window_s=0,
            key_source="derived",
            idempotency_key=new_id("derived"),
            arguments={"order_id": "1001"},
        ),
        summary="look up order 1001",
    )
    answer = OutcomeRecord("completed", result={"content": [{"type": "text", "text": "order 1001"}]})
    before = trips.total
    assert store.admissible_read(req)
    store.record_read(ReadRecord(req, answer, observed_at=req.identity.now))
    # admissible_read: BEGIN, its lookup, COMMIT. record_read: as an admission, but its three events
    # go in their own statement: in one with the head's move they would be more parameters than psycopg
    # caches a statement's conversion for, which costs more than the round trip (store.log).
    assert trips.total - before == 12
