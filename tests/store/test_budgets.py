"""Budget counters: checked and charged in the admission transaction, so a burst never passes a limit."""

from __future__ import annotations

import dataclasses
from collections import Counter
from datetime import timedelta

import pytest
from sqlalchemy import select

from store import Admission, ApprovedDispatch, Store
from store.commands import DecideApproval
from store.model import ApprovalNeed, Charge
from store.partitions import Partitioning, configure
from store.schema import budget_counters
from tests.store.builders import NOW, REQUIRE_APPROVAL, call_request
from tests.store.racing import at_once, in_processes
from tests.store.workers import admit_against_budget

M = 1_000_000
RESETS = NOW.replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(days=1)


def _calls(limit: int, amount: int = 1, key: str = "counter-a") -> tuple[Charge, ...]:
    start = RESETS - timedelta(days=1)
    return (Charge("daily-calls", key, amount * M, limit * M, start, RESETS, "principal"),)


def _used(store: Store) -> dict[str, int]:
    with store.engine.connect() as conn:
        rows = conn.execute(select(budget_counters.c.counter_key, budget_counters.c.used_micros)).all()
    return {row.counter_key: int(row.used_micros) for row in rows}


def _admit(store: Store, n: int, charges: tuple[Charge, ...]) -> Admission:
    return store.admit(call_request(tool_call_id=f"tc-{n}", idempotency_key=f"k-{n}", charges=charges))


def test_twenty_concurrent_calls_against_a_limit_of_ten_admit_exactly_ten(store: Store) -> None:
    admissions = at_once(lambda n: _admit(store, n, _calls(limit=10)), range(20))

    admitted = [a for a in admissions if a.call.status == "dispatching"]
    refused = [a for a in admissions if a.call.status == "denied"]
    assert len(admitted) == 10
    assert len(refused) == 10
    assert all(a.call.reason == "budget_exceeded" and a.breach is not None for a in refused)
    assert _used(store) == {"counter-a": 10 * M}
    types = [e.type for e in store.events()]
    assert types.count("budget.exceeded") == 10
    assert store.verify().ok


@pytest.mark.postgres
def test_replicas_with_their_own_connections_admit_exactly_the_limit(pg_schema_url: str) -> None:
    with Store.open(pg_schema_url) as store:
        store.migrate()
        outcomes = in_processes(admit_against_budget, pg_schema_url, 4, 5, 10)
        assert Counter(outcomes) == {("dispatching", "within_limits"): 10, ("denied", "budget_exceeded"): 10}
        assert _used(store) == {"shared-counter": 10 * M}
        assert store.verify().ok


@pytest.mark.postgres
def test_replicas_admit_exactly_the_limit_when_the_calls_are_in_different_buckets(pg_schema_url: str) -> None:
    # A tenant's log in 4 buckets, one run per call: the calls append under different heads, and
    # the counter they share is still checked and charged one call at a time.
    with Store.open(pg_schema_url) as store:
        store.migrate()
        outcomes = in_processes(admit_against_budget, pg_schema_url, 4, 5, 10, 4)
        assert Counter(outcomes) == {("dispatching", "within_limits"): 10, ("denied", "budget_exceeded"): 10}
        configure(store.engine, Partitioning("tenant", 4))
        assert _used(store) == {"shared-counter": 10 * M}
        assert len({p for p in store.partition_heads() if p}) > 1
        assert store.verify().ok


def test_the_refusal_records_budget_exceeded_caused_by_the_request(store: Store) -> None:
    _admit(store, 1, _calls(limit=1))
    refused = _admit(store, 2, _calls(limit=1))

    assert refused.breach is not None
    assert refused.breach.resets_at == RESETS
    events = [e for e in store.events() if e.tool_call_id == "tc-2"]
    assert [e.type for e in events] == ["tool_call.requested", "budget.exceeded", "tool_call.denied"]
    requested, exceeded, denied = events
    assert exceeded.causation_id == requested.event_id
    assert exceeded.payload["budget"] == "daily-calls"
    assert (exceeded.payload["limit"], exceeded.payload["used"], exceeded.payload["amount"]) == (1, 1, 1)
    assert exceeded.payload["resets_at"] == "2026-12-01T00:00:00.000000Z"
    assert denied.payload["reason"] == "budget_exceeded"
    # The refused call charged nothing and claimed no key.
    assert "charges" not in requested.payload or requested.payload["charges"] is None
    assert _used(store) == {"counter-a": 1 * M}


def test_spend_is_summed_exactly_and_the_call_that_would_pass_the_limit_is_refused(store: Store) -> None:
    outcomes = [
        _admit(store, n, _calls(limit=1000, amount=amount)) for n, amount in enumerate([400, 400, 300])
    ]

    assert [a.call.status for a in outcomes] == ["dispatching", "dispatching", "denied"]
    exceeded = next(e for e in store.events() if e.type == "budget.exceeded")
    assert (exceeded.payload["used"], exceeded.payload["amount"]) == (800, 300)
    assert _used(store) == {"counter-a": 800 * M}


def test_joined_and_conflicting_calls_are_never_charged(store: Store) -> None:
    first = store.admit(call_request(tool_call_id="tc-1", idempotency_key="same", charges=_calls(limit=1)))
    joined = store.admit(call_request(tool_call_id="tc-2", idempotency_key="same", charges=_calls(limit=1)))
    conflict = store.admit(
        call_request(
            tool_call_id="tc-3", idempotency_key="same", action_hash="other", charges=_calls(limit=1)
        )
    )

    assert first.call.status == "dispatching"
    assert joined.kind == "joined"
    assert conflict.kind == "conflict"
    assert conflict.call.reason == "idempotency_conflict"
    assert _used(store) == {"counter-a": 1 * M}


def test_counters_survive_a_restart(migrated_url: str) -> None:
    with Store.open(migrated_url) as store:
        for n in range(10):
            assert _admit(store, n, _calls(limit=10)).call.status == "dispatching"
    with Store.open(migrated_url) as reopened:
        eleventh = _admit(reopened, 10, _calls(limit=10))
    assert eleventh.call.reason == "budget_exceeded"


def test_rebuild_sums_the_counters_again_from_the_log(store: Store) -> None:
    for n in range(3):
        _admit(store, n, _calls(limit=10, key="counter-a"))
    _admit(store, 3, _calls(limit=10, amount=2, key="counter-b"))
    before = _used(store)

    store.rebuild()

    assert before == {"counter-a": 3 * M, "counter-b": 2 * M}
    assert _used(store) == before
    assert store.verify().ok


def test_a_call_without_charges_reads_no_counter_and_is_admitted(store: Store) -> None:
    assert _admit(store, 1, ()).call.status == "dispatching"
    assert _used(store) == {}


ASK = ApprovalNeed("finance", 3600, False)
OVER_BUDGET = dataclasses.replace(
    REQUIRE_APPROVAL, reason="budget_exceeded", rule_id="daily-calls", approval=ASK
)


def _asking(store: Store, n: int, charges: tuple[Charge, ...]) -> Admission:
    request = call_request(tool_call_id=f"tc-{n}", idempotency_key=f"k-{n}", charges=charges)
    return store.admit(
        dataclasses.replace(
            request,
            over_budget=OVER_BUDGET,
            approval_id=f"ap-{n}",
            approval_expires_at=NOW + timedelta(hours=1),
            held_arguments={"order": 1001},
        )
    )


def test_a_budget_saying_require_approval_sends_the_call_past_it_to_a_person(store: Store) -> None:
    asks = tuple(dataclasses.replace(c, approval=ASK) for c in _calls(limit=2))
    admissions = [_asking(store, n, asks) for n in range(3)]

    assert [a.call.status for a in admissions] == ["dispatching", "dispatching", "approval_pending"]
    assert admissions[2].breach is None and admissions[2].call.approval_id == "ap-2"
    assert [e.type for e in store.events(tool_call_id="tc-2")] == [
        "tool_call.requested",
        "budget.exceeded",
        "approval.required",
    ]
    assert store.events(tool_call_id="tc-2")[0].payload["decision"]["reason"] == "budget_exceeded"
    assert _used(store) == {"counter-a": 3 * M}  # charged past the limit while a person decides
    approved = store.decide_approval(DecideApproval("ap-2", approve=True, decided_by="bob", now=NOW))
    assert approved.status == "approved"
    ran = store.dispatch_approved(ApprovedDispatch("tc-2", now=NOW, charges=asks))
    assert ran.status == "dispatching"  # charged when admitted: not refused again at execution
    assert _used(store) == {"counter-a": 3 * M}
    store.rebuild()
    assert _used(store) == {"counter-a": 3 * M}
    assert store.verify().ok


def test_a_call_past_a_budget_that_denies_is_denied_even_if_another_would_ask(store: Store) -> None:
    asks = dataclasses.replace(_calls(limit=1)[0], approval=ASK)
    denies = _calls(limit=1, key="counter-b")[0]
    _asking(store, 0, (asks, denies))

    refused = _asking(store, 1, (asks, denies))

    assert (refused.call.status, refused.call.reason) == ("denied", "budget_exceeded")
    assert store.held_arguments("ap-1") is None
