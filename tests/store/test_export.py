"""The audit export's query: filters by tenant, time, type, principal and capability, and a cursor that
walks a log of several tenants once, in seq order."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from store import EventFilter, PrincipalRecord, Store
from tests.store.builders import NOW, call_request, outcome

HOUR = timedelta(hours=1)


def call(
    store: Store,
    tenant: str,
    subject: str,
    tool_call_id: str,
    *,
    run_id: str,
    capability: str,
    hours: int,
    kind: Any = "completed",
) -> None:
    when = NOW + hours * HOUR
    principal = PrincipalRecord(subject, tenant, roles=("agent",), client_id="c")
    store.admit(
        call_request(
            tenant=tenant,
            subject=subject,
            principal=principal,
            tool_call_id=tool_call_id,
            run_id=run_id,
            capability_id=capability,
            idempotency_key=f"key-{tool_call_id}",
            now=when,
        )
    )
    store.record_outcome(outcome(tool_call_id, kind, now=when, result={"ok": True}))


def several_tenants(store: Store) -> None:
    """Two tenants, three principals, two capabilities, four calls an hour apart."""
    call(store, "acme", "alice", "tc-a1", run_id="run-a", capability="refund-order", hours=0)
    call(store, "acme", "bob", "tc-b1", run_id="run-b", capability="lookup-order", hours=1)
    call(store, "globex", "carol", "tc-g1", run_id="run-g", capability="refund-order", hours=2)
    call(store, "acme", "alice", "tc-a2", run_id="run-a", capability="refund-order", hours=3, kind="failed")


@pytest.fixture
def logged(store: Store) -> Store:
    several_tenants(store)
    return store


def exported(store: Store, **given: Any) -> list[dict[str, Any]]:
    return list(store.export(EventFilter(**given)))


def calls_of(events: list[dict[str, Any]]) -> set[str | None]:
    return {e["tool_call_id"] for e in events}


def test_a_tenants_export_is_its_whole_log_and_nothing_else(logged: Store) -> None:
    everything = exported(logged)

    acme = exported(logged, tenant="acme")

    assert acme == [e for e in everything if e["tenant"] == "acme"]
    assert calls_of(acme) - {None} == {"tc-a1", "tc-b1", "tc-a2"}
    assert {e["tenant"] for e in exported(logged, tenant="globex")} == {"globex"}
    assert [e["seq"] for e in everything] == sorted(e["seq"] for e in everything)


def test_types_are_exact_or_a_prefix_ending_in_a_star(logged: Store) -> None:
    completed = exported(logged, types=("tool_call.completed",))
    tool_calls = exported(logged, tenant="acme", types=("tool_call.*",))
    mixed = exported(logged, types=("run.started", "tool_call.failed"))

    assert calls_of(completed) == {"tc-a1", "tc-b1", "tc-g1"}
    assert {e["type"] for e in tool_calls} == {
        "tool_call.requested",
        "tool_call.dispatching",
        "tool_call.completed",
        "tool_call.failed",
    }
    assert {e["type"] for e in mixed} == {"run.started", "tool_call.failed"}
    assert len([e for e in mixed if e["type"] == "run.started"]) == 3
    # The star is a prefix of whole text: `_` is no wildcard, so `tool.call.*` matches nothing.
    assert exported(logged, types=("tool_call*",)) != []
    assert exported(logged, types=("tool.call.*",)) == []


def test_since_is_inclusive_and_until_exclusive(logged: Store) -> None:
    window = exported(logged, since=NOW + HOUR, until=NOW + 3 * HOUR)

    assert calls_of(window) - {None} == {"tc-b1", "tc-g1"}
    assert exported(logged, since=NOW + 4 * HOUR) == []
    assert calls_of(exported(logged, until=NOW + HOUR)) - {None} == {"tc-a1"}


def test_a_principal_is_the_events_of_its_runs_and_calls(logged: Store) -> None:
    alice = exported(logged, tenant="acme", subject="alice")

    assert calls_of(alice) - {None} == {"tc-a1", "tc-a2"}
    assert {e["run_id"] for e in alice} == {"run-a"}
    assert [e["type"] for e in alice].count("run.started") == 1
    assert exported(logged, tenant="globex", subject="alice") == []


def test_a_capability_is_the_events_recorded_under_it(logged: Store) -> None:
    refunds = exported(logged, capability_id="refund-order")

    assert calls_of(refunds) - {None} == {"tc-a1", "tc-g1", "tc-a2"}
    assert {e["capability_id"] for e in refunds} == {"refund-order"}
    assert calls_of(exported(logged, tenant="acme", capability_id="refund-order")) - {None} == {
        "tc-a1",
        "tc-a2",
    }


def test_pages_after_a_cursor_walk_the_log_once(logged: Store) -> None:
    whole = exported(logged, tenant="acme")
    walked: list[dict[str, Any]] = []
    cursor = 0
    while page := list(logged.export(EventFilter(tenant="acme"), after_seq=cursor, limit=2)):
        assert len(page) <= 2
        walked.extend(page)
        cursor = page[-1]["seq"]

    assert walked == whole
    assert len(whole) > 4


def test_a_key_no_row_can_hold_finds_nothing(logged: Store) -> None:
    assert exported(logged, tenant="acme\x00") == []
    assert exported(logged, types=("tool_call.\ud800",)) == []
