"""The periodic passes' look (store.agenda): which kinds of work are due, in one statement, on both
stores; each kind answers true exactly when the work it stands for would find something."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from store import Store, agenda
from store.agenda import Due
from store.commands import DecideApproval, StartReconciliation
from store.model import Charge, LoopKey
from store.pruning import GRACE
from tests.store.builders import NOW, REQUIRE_APPROVAL, call_request, outcome

pytestmark = pytest.mark.anyio

LEASE_S = 30.0
HOUR = timedelta(hours=1)
START = NOW.replace(minute=0, second=0, microsecond=0)


async def looked(store: Store, at: Any) -> Due:
    """The look from the event loop, which the passes make, checked against the same statement run on
    a pooled connection."""
    due = await store.due_work_async(now=at)
    with store.engine.connect() as conn:
        assert agenda.due(conn, now=at) == due
    return due


def dispatching(store: Store) -> None:
    store.admit(call_request(tool_call_id="tc-1", lease_s=LEASE_S))


def unknown(store: Store) -> None:
    dispatching(store)
    store.record_outcome(outcome("tc-1", "unknown", error="response_timeout", now=NOW))


def awaiting_approval(store: Store) -> str:
    request = call_request(tool_call_id="tc-1", decision=REQUIRE_APPROVAL)
    store.admit(request)
    assert request.approval_id is not None
    return request.approval_id


def approved(store: Store) -> None:
    approval_id = awaiting_approval(store)
    store.decide_approval(DecideApproval(approval_id, approve=True, decided_by="bob", now=NOW))


def awaiting_confirmation(store: Store) -> None:
    store.admit(
        call_request(
            tool_call_id="tc-1", confirmation_id="cf-1", confirmation_expires_at=NOW + timedelta(minutes=10)
        )
    )


def counted_in_a_window(store: Store) -> None:
    charge = Charge("calls", "counter-1", 1, 100, START, START + HOUR, "principal")
    loop = LoopKey("same-call", "repeated_action", "p-1", 100, 3600, START, START + HOUR)
    store.admit(call_request(tool_call_id="tc-1", charges=(charge,), loops=(loop,)))
    store.record_outcome(outcome("tc-1", "completed", now=NOW))


CASES: list[tuple[str, Callable[[Store], object], timedelta | None, timedelta, Due]] = [
    # What is stored, a moment at which nothing is due yet (None: due at once), one at which it is, and
    # what is due then. Before an unknown outcome or an approval is recorded, nothing is due: below.
    (
        "a dispatch past its lease",
        dispatching,
        timedelta(0),
        timedelta(seconds=LEASE_S + 1),
        Due(expired_leases=True),
    ),
    ("an unknown outcome", unknown, None, timedelta(0), Due(reconciliations=True)),
    ("an approved call", approved, None, timedelta(0), Due(approved=True)),
    ("an approval past its expiry", awaiting_approval, timedelta(0), HOUR, Due(expired_approvals=True)),
    (
        "a confirmation past its expiry",
        awaiting_confirmation,
        timedelta(minutes=9),
        timedelta(minutes=10),
        Due(expired_confirmations=True),
    ),
    (
        "a window that ended",
        counted_in_a_window,
        HOUR,
        HOUR + GRACE + timedelta(seconds=1),
        Due(prunable=True),
    ),
]


@pytest.mark.parametrize(("stored", "setup", "early", "late", "due"), CASES, ids=[c[0] for c in CASES])
async def test_each_kind_of_work_is_due_exactly_when_its_work_would_find_some(
    store: Store,
    stored: str,
    setup: Callable[[Store], object],
    early: timedelta | None,
    late: timedelta,
    due: Due,
) -> None:
    setup(store)

    if early is not None:
        assert await looked(store, NOW + early) == Due()
    assert await looked(store, NOW + late) == due


async def test_the_look_agrees_with_the_work_it_stands_for(store: Store) -> None:
    dispatching(store)
    late = NOW + timedelta(seconds=LEASE_S + 1)
    assert (await looked(store, late)).expired_leases and store.recover_expired(now=late)
    # Recovered: the call is unknown now, so its lookup is due and its lease is not.
    assert await looked(store, late) == Due(reconciliations=True)
    call = store.get_call("tc-1")
    assert call is not None
    store.start_reconciliation(
        StartReconciliation(
            "tc-1", expected_token=call.lease_token, method="lookup", owner="rec", lease_s=30, now=late
        )
    )
    assert await looked(store, late) == Due()  # leased by a reconciler: not due for another


async def test_nothing_is_due_in_an_empty_store_or_one_of_settled_and_waiting_calls(store: Store) -> None:
    assert await looked(store, NOW) == Due()
    store.admit(call_request(tool_call_id="live", idempotency_key="k-live", lease_s=3600))
    store.admit(call_request(tool_call_id="done", idempotency_key="k-done"))
    store.record_outcome(outcome("done", "completed", now=NOW))
    store.admit(call_request(tool_call_id="waiting", idempotency_key="k-wait", decision=REQUIRE_APPROVAL))

    assert await looked(store, NOW + timedelta(minutes=5)) == Due()


async def test_the_look_sees_what_another_replica_left(store: Store, migrated_url: str) -> None:
    await looked(store, NOW)  # the loop's connection is open and kept before the other replica writes
    with Store.open(migrated_url) as other:
        dispatching(other)

    assert await looked(store, NOW + timedelta(seconds=LEASE_S + 1)) == Due(expired_leases=True)


async def test_appended_counts_every_event_of_the_log(store: Store) -> None:
    assert await store.appended_async() == 0
    unknown(store)

    assert await store.appended_async() == sum(seq for seq, _ in store.partition_heads().values()) > 0


def test_pruning_with_nothing_ended_takes_no_write_transaction(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    counted_in_a_window(store)

    def refused(*args: object, **kwargs: object) -> object:
        raise AssertionError("a write transaction was taken with nothing to prune")

    monkeypatch.setattr(store.writer, "run", refused)
    assert store.prune_expired(now=NOW + HOUR) == 0
    monkeypatch.undo()
    assert store.prune_expired(now=NOW + HOUR + GRACE + timedelta(seconds=1)) == 2


def test_approvals_past_their_expiry_are_found_from_an_index_not_a_scan(store: Store) -> None:
    # Every replica asks every second; `approvals` keeps every approval ever made.
    ask = (
        "SELECT approval_id FROM approvals WHERE status = 'awaiting_approval' AND expires_at <= '2026-12-02'"
    )
    with store.engine.begin() as conn:
        if store.engine.dialect.name == "sqlite":
            plan = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {ask}").all()
        else:
            conn.exec_driver_sql("SET LOCAL enable_seqscan = off")  # a tiny table is scanned otherwise
            plan = conn.exec_driver_sql(f"EXPLAIN {ask}").all()
    assert "ix_approvals_status_expires_at" in str(plan), plan


def test_failures_due_for_a_recheck_are_found_from_an_index_not_a_scan(store: Store) -> None:
    # Every replica asks every second, and failed calls only accumulate.
    ask = (
        "SELECT tool_call_id FROM tool_calls WHERE next_reconcile_at <= '2026-12-02' AND status = 'failed'"
        " AND verification_status = 'confirmed_failure'"
    )
    with store.engine.begin() as conn:
        if store.engine.dialect.name == "sqlite":
            plan = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {ask}").all()
        else:
            conn.exec_driver_sql("SET LOCAL enable_seqscan = off")  # a tiny table is scanned otherwise
            plan = conn.exec_driver_sql(f"EXPLAIN {ask}").all()
    assert "ix_tool_calls_status_next_reconcile" in str(plan), plan
