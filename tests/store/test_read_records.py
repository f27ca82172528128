"""A read allowed outright, recorded whole after it ran: one transaction, refused if it lost its standing
or its budget meanwhile, and the same record a replay of the log rebuilds."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select

from store import CallRequest, OutcomeRecord, ReadRecord, Store, StoreError
from store.commands import RevokePrincipal
from store.events import format_ts
from store.model import Charge
from store.schema import budget_counters
from tests.commits import write_commits
from tests.store.builders import NOW, call_request
from tests.store.racing import at_once

LATER = NOW + timedelta(milliseconds=40)
M = 1_000_000
ANSWER = {"content": [{"type": "text", "text": "order 1001: 250.00 EUR"}], "isError": False}


def read_request(n: int = 1, **changes: object) -> CallRequest:
    """Alice looking up order 1001 under a derived key, allowed outright."""
    fields: dict[str, object] = {
        "tool_call_id": f"tc-read-{n}",
        "tool_name": "lookup_order",
        "capability_id": "lookup-order",
        "capability_version": "1",
        "arguments": {"order_id": "1001"},
        "action_hash": "action-lookup",
        "idempotency_key": "derived-lookup",
        "key_source": "derived",
        "run_id": f"run-read-{n}",
        "run_origin": "client",
        "effect_class": "read",
        "dedupe_window_s": 0,
        "summary": "look up order 1001",
        **changes,
    }
    return call_request(**fields)


def answered(request: CallRequest, result: dict[str, object] = ANSWER) -> ReadRecord:
    return ReadRecord(request, OutcomeRecord("completed", result=result), observed_at=LATER)


def test_a_read_is_recorded_from_its_intent_to_its_answer_in_one_commit(store: Store) -> None:
    with write_commits(store) as seen:
        admission = store.record_read(answered(read_request()))

    assert len(seen) == 1
    call = admission.call
    assert (admission.kind, call.status, call.result) == ("new", "completed", ANSWER)
    assert (call.created_at, call.updated_at, call.lease_expires_at) == (NOW, LATER, None)
    recorded = store.events(tool_call_id="tc-read-1")
    assert [e.type for e in recorded] == [
        "tool_call.requested",
        "tool_call.dispatching",
        "tool_call.completed",
    ]
    assert [e.causation_id for e in recorded[1:]] == [recorded[0].event_id, recorded[1].event_id]
    assert recorded[-1].occurred_at == format_ts(LATER)
    assert store.verify().ok
    store.rebuild()
    assert store.get_call("tc-read-1") == call


def test_a_failed_read_is_recorded_failed_in_the_same_one_transaction(store: Store) -> None:
    failed = OutcomeRecord("failed", error="http_404", detail="no such order")

    call = store.record_read(ReadRecord(read_request(), failed, observed_at=LATER)).call

    assert (call.status, call.error) == ("failed", "http_404")
    assert [e.type for e in store.events(tool_call_id="tc-read-1")][-1] == "tool_call.failed"


def test_the_next_identical_read_takes_over_the_derived_key_and_both_are_kept(store: Store) -> None:
    first = store.record_read(answered(read_request(1, run_id="run-r"))).call
    second = store.record_read(answered(read_request(2, run_id="run-r"))).call

    assert {first.status, second.status} == {"completed"}
    holder = store.find_call_by_key("acme", "alice", "derived-lookup")
    assert holder is not None and holder.tool_call_id == second.tool_call_id
    assert store.verify().ok
    store.rebuild()
    assert store.find_call_by_key("acme", "alice", "derived-lookup") == holder


def test_a_read_whose_principal_was_revoked_while_it_ran_is_refused_and_its_answer_not_kept(
    store: Store,
) -> None:
    request = read_request()
    assert store.admissible_read(request)
    store.revoke_principal(RevokePrincipal("acme", "alice", revoked_by="root", now=NOW))

    assert not store.admissible_read(request)
    call = store.record_read(answered(request)).call

    assert (call.status, call.reason, call.result) == ("denied", "principal_revoked", None)
    recorded = store.events(tool_call_id="tc-read-1")
    assert [e.type for e in recorded] == ["tool_call.requested", "tool_call.denied"]
    assert "250.00 EUR" not in str([e.payload for e in recorded])


def _counter(limit: int) -> tuple[Charge, ...]:
    start = NOW.replace(hour=0, minute=0, second=0, microsecond=0)
    return (Charge("daily-calls", "reads", M, limit * M, start, start + timedelta(days=1), "principal"),)


def test_twenty_concurrent_reads_against_a_limit_of_ten_keep_exactly_ten_answers(store: Store) -> None:
    # Each read passed `admissible_read` before the counter filled: the commit decides, under the lock.
    requests = [read_request(n, charges=_counter(10)) for n in range(20)]
    assert all(store.admissible_read(r) for r in requests)
    admissions = at_once(lambda request: store.record_read(answered(request)), requests)

    kept = [a.call for a in admissions if a.call.status == "completed"]
    refused = [a for a in admissions if a.call.status == "denied"]
    assert len(kept) == 10 and all(c.result == ANSWER for c in kept)
    assert len(refused) == 10
    assert all(a.call.reason == "budget_exceeded" and a.breach is not None for a in refused)
    assert all(a.call.result is None for a in refused)
    with store.engine.connect() as conn:
        assert conn.execute(select(budget_counters.c.used_micros)).scalar_one() == 10 * M
    types = [e.type for e in store.events()]
    assert (types.count("budget.exceeded"), types.count("tool_call.completed")) == (10, 10)
    assert not store.admissible_read(read_request(99, charges=_counter(10)))
    assert store.verify().ok


@pytest.mark.postgres
def test_two_replicas_recording_twenty_counted_reads_against_a_limit_of_ten_keep_exactly_ten(
    pg_schema_url: str,
) -> None:
    with Store.open(pg_schema_url) as one, Store.open(pg_schema_url) as other:
        one.migrate()
        requests = [read_request(n, charges=_counter(10)) for n in range(20)]
        assert all(one.admissible_read(r) for r in requests)
        replicas = [one, other]
        admissions = at_once(
            lambda n: replicas[n % 2].record_read(answered(requests[n])), range(len(requests))
        )

        statuses = [a.call.status for a in admissions]
        assert (statuses.count("completed"), statuses.count("denied")) == (10, 10)
        refused = [a.call for a in admissions if a.call.status == "denied"]
        assert all(c.reason == "budget_exceeded" and c.result is None for c in refused)
        with one.engine.connect() as conn:
            assert conn.execute(select(budget_counters.c.used_micros)).scalar_one() == 10 * M
        assert one.verify().ok


def test_a_read_refused_at_its_commit_says_the_backend_was_asked(store: Store) -> None:
    store.record_read(answered(read_request(1, charges=_counter(1))))

    call = store.record_read(answered(read_request(2, charges=_counter(1)))).call

    assert (call.status, call.reason) == ("denied", "budget_exceeded")
    denied = store.events(tool_call_id="tc-read-2")[-1].payload
    assert "had reached the backend" in str(denied) and "250.00 EUR" not in str(denied)


def test_a_read_over_its_budget_before_it_runs_is_not_admissible(store: Store) -> None:
    store.record_read(answered(read_request(1, charges=_counter(1))))

    assert not store.admissible_read(read_request(2, charges=_counter(1)))
    assert store.admissible_read(read_request(3, charges=_counter(2)))


def test_a_read_is_charged_in_the_log_like_any_admitted_call(store: Store) -> None:
    store.record_read(answered(read_request(charges=_counter(5))))

    requested = store.events(tool_call_id="tc-read-1")[0]
    assert requested.payload["charges"][0]["amount_micros"] == M
    store.rebuild()
    with store.engine.connect() as conn:
        assert conn.execute(select(budget_counters.c.used_micros)).scalar_one() == M


def test_a_read_naming_another_tenants_run_is_refused_by_the_store(store: Store) -> None:
    store.record_read(answered(read_request(1, run_id="run-x")))
    theirs = read_request(2, run_id="run-x", tenant="globex")

    with pytest.raises(StoreError, match="belongs to another tenant"):
        store.admissible_read(theirs)
    with pytest.raises(StoreError, match="belongs to another tenant"):
        store.record_read(answered(theirs))
    assert store.get_call("tc-read-2") is None
