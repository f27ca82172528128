"""Runs in the store, on both stores: stopped and resumed by a person (`run.stopped`, `run.resumed`),
decided under the head lock so every replica agrees; and calls that are in no run at all."""

from __future__ import annotations

from datetime import timedelta

import pytest

from store import ApprovedDispatch, ConfirmationAnswer, NotFound, StaleLease, Store
from store.commands import DecideApproval, ResumeRun, StopRun
from store.model import RunView
from tests.store.builders import NOW, REQUIRE_APPROVAL, call_request

LATER = NOW + timedelta(minutes=5)


def stop(store: Store, run_id: str = "run-1", *, tenant: str = "acme") -> RunView:
    return store.stop_run(
        StopRun(run_id, stopped_by="carol", reason="runaway agent", now=LATER, tenant=tenant)
    )


def test_a_stopped_runs_later_calls_are_refused_run_stopped_and_claim_no_key(store: Store) -> None:
    store.admit(call_request(tool_call_id="before", idempotency_key="k0"))

    run = stop(store)
    refused = store.admit(call_request(tool_call_id="after", idempotency_key="k1", now=LATER))
    elsewhere = store.admit(call_request(tool_call_id="other", idempotency_key="k2", run_id="run-2"))

    assert (run.status, run.stopped_by, run.stop_reason) == ("stopped", "carol", "runaway agent")
    assert (refused.call.status, refused.call.reason) == ("denied", "run_stopped")
    assert not refused.owns_dispatch
    assert store.find_call_by_key("acme", "alice", "k1") is None
    assert elsewhere.owns_dispatch
    assert [e.type for e in store.events(tool_call_id="after")] == ["tool_call.requested", "tool_call.denied"]
    assert store.verify().ok


def test_a_resumed_run_takes_calls_again_and_both_acts_are_recorded_with_who_and_why(store: Store) -> None:
    store.admit(call_request(tool_call_id="before", idempotency_key="k0"))
    stop(store)

    run = store.resume_run(ResumeRun("run-1", resumed_by="dave", reason="fixed", now=LATER, tenant="acme"))
    admitted = store.admit(call_request(tool_call_id="after", idempotency_key="k1", now=LATER))

    assert run.status == "active" and admitted.owns_dispatch
    controls = [
        e for e in store.events(run_id="run-1") if e.type.startswith("run.") and e.type != "run.started"
    ]
    assert [(e.type, e.payload) for e in controls] == [
        (
            "run.stopped",
            {"stopped_by": "carol", "reason": "runaway agent", "break_glass": False, "withdrawn": None},
        ),
        ("run.resumed", {"resumed_by": "dave", "reason": "fixed", "break_glass": False}),
    ]
    assert store.verify().ok


def test_stopping_withdraws_the_runs_waiting_approvals_and_refuses_its_approved_calls(store: Store) -> None:
    store.admit(call_request(tool_call_id="waiting", idempotency_key="k1", decision=REQUIRE_APPROVAL))
    approved = call_request(tool_call_id="approved", idempotency_key="k2", decision=REQUIRE_APPROVAL)
    store.admit(approved)
    assert approved.approval_id is not None
    store.decide_approval(DecideApproval(approved.approval_id, approve=True, decided_by="bob", now=NOW))
    other = call_request(
        tool_call_id="other-run", idempotency_key="k3", run_id="run-2", decision=REQUIRE_APPROVAL
    )
    store.admit(other)

    stop(store)

    waiting = store.get_call("waiting")
    assert waiting is not None and waiting.status == "rejected"
    assert waiting.approval_id is not None
    approval = store.get_approval(waiting.approval_id)
    assert approval is not None and (approval.status, approval.decided_by) == ("rejected", "carol")
    refused = store.get_call("approved")
    assert refused is not None and (refused.status, refused.reason) == ("denied", "run_stopped")
    untouched = store.get_call("other-run")
    assert untouched is not None and untouched.status == "approval_pending"
    stop_event = next(e for e in store.events(run_id="run-1") if e.type == "run.stopped")
    assert stop_event.payload["withdrawn"] == [waiting.approval_id]
    withdrawal = store.events(tool_call_id="waiting")[-1]
    assert withdrawal.type == "approval.rejected"
    assert (withdrawal.payload["withdrawn"], withdrawal.causation_id) == ("run_stopped", stop_event.event_id)
    with pytest.raises(StaleLease):
        store.decide_approval(DecideApproval(waiting.approval_id, approve=True, decided_by="bob", now=LATER))
    with pytest.raises(StaleLease):
        store.dispatch_approved(ApprovedDispatch("approved", now=LATER))
    assert store.held_arguments(waiting.approval_id) is None
    assert store.verify().ok


def test_a_run_is_stopped_once_resumed_only_when_stopped_and_never_across_tenants(store: Store) -> None:
    store.admit(call_request(tool_call_id="c", idempotency_key="k0"))

    with pytest.raises(StaleLease):
        store.resume_run(ResumeRun("run-1", resumed_by="dave", reason="r", now=LATER, tenant="acme"))
    with pytest.raises(NotFound):
        stop(store, tenant="globex")
    with pytest.raises(NotFound):
        stop(store, run_id="run-nobody")
    stop(store)
    with pytest.raises(StaleLease):
        stop(store)
    assert [e.type for e in store.events(run_id="run-1")].count("run.stopped") == 1


def test_a_replica_admits_nothing_in_a_run_another_replica_stopped(store: Store) -> None:
    store.admit(call_request(tool_call_id="c", idempotency_key="k0"))
    with Store.open(str(store.engine.url.render_as_string(hide_password=False))) as replica:
        stop(replica)
        refused = store.admit(call_request(tool_call_id="after", idempotency_key="k1", now=LATER))

    assert refused.call.reason == "run_stopped"


def test_a_read_of_a_stopped_run_is_not_run_before_it_is_recorded(store: Store) -> None:
    store.admit(call_request(tool_call_id="c", idempotency_key="k0"))
    stop(store)
    read = call_request(
        tool_call_id="read", idempotency_key="k-read", key_source="derived", effect_class="read"
    )

    assert not store.admissible_read(read)
    assert store.admit(read).call.reason == "run_stopped"


def test_a_call_in_no_run_starts_none_counts_in_none_and_replays(store: Store) -> None:
    admitted = store.admit(
        call_request(tool_call_id="runless", idempotency_key="k1", run_id=None, run_origin=None)
    )

    assert admitted.owns_dispatch and admitted.call.run_id is None
    assert [e.type for e in store.events(tool_call_id="runless")][0] == "tool_call.requested"
    assert not any(e.type == "run.started" for e in store.events(tenant="acme"))
    assert store.list_runs(tenant="acme") == []
    assert store.verify().ok
    store.rebuild()
    call = store.get_call("runless")
    assert call is not None and call.run_id is None


def test_runs_are_listed_newest_first_with_their_origin_and_calls(store: Store) -> None:
    store.admit(call_request(tool_call_id="a", idempotency_key="k1", run_id="run-a", run_origin="session"))
    later = call_request(tool_call_id="b", idempotency_key="k2", run_id="run-b", now=LATER)
    store.admit(later)
    store.admit(call_request(tool_call_id="c", idempotency_key="k3", run_id="run-b", now=LATER))

    runs = store.list_runs(tenant="acme")

    assert [(r.run_id, r.origin, r.call_count) for r in runs] == [
        ("run-b", "client", 2),
        ("run-a", "session", 1),
    ]
    assert [c.tool_call_id for c in store.run_calls("run-b")] == ["b", "c"]
    assert store.list_runs(tenant="globex") == []
    stop(store, run_id="run-b")
    assert [r.run_id for r in store.list_runs(tenant="acme", status="stopped")] == ["run-b"]
    store.rebuild()
    rebuilt = store.get_run("run-b", tenant="acme")
    assert rebuilt is not None and (rebuilt.status, rebuilt.stopped_by) == ("stopped", "carol")


def test_stopping_ends_the_runs_calls_awaiting_the_users_confirmation(store: Store) -> None:
    store.admit(
        call_request(
            tool_call_id="confirming",
            idempotency_key="k1",
            confirmation_id="cf-1",
            confirmation_expires_at=NOW + timedelta(hours=1),
        )
    )

    stop(store)

    call = store.get_call("confirming")
    assert call is not None and (call.status, call.reason) == ("expired", "run_stopped")
    with pytest.raises(StaleLease):
        store.answer_confirmation(
            ConfirmationAnswer(
                "confirming",
                confirmation_id="cf-1",
                action_hash="action-a",
                action="accept",
                answered_by="alice",
                now=LATER,
            )
        )
    assert store.verify().ok


def _run_index(store: Store, table: str) -> tuple[str | None, str]:
    """The condition of the table's run_id index, and the plan of a run's lookup (seq scans off)."""
    name = f"ix_{table}_run_id"
    lookup = f"SELECT * FROM {table} WHERE run_id = 'run-1'"
    with store.engine.begin() as conn:
        if store.engine.dialect.name == "sqlite":
            (sql,) = conn.exec_driver_sql("SELECT sql FROM sqlite_master WHERE name = ?", (name,)).one()
            plan = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {lookup}").all()
            where = sql.partition(" WHERE ")[2] or None
            return where, str(plan)
        conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
        plan = conn.exec_driver_sql(f"EXPLAIN {lookup}").all()
        (where,) = conn.exec_driver_sql(
            "SELECT pg_get_expr(i.indpred, i.indrelid) FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE c.relname = %(name)s AND c.relnamespace = current_schema()::regnamespace",
            {"name": name},
        ).one()
        return where, str(plan)


@pytest.mark.parametrize("table", ["events", "tool_calls"])
def test_the_run_indexes_leave_out_calls_in_no_run_and_a_runs_lookup_still_uses_them(
    store: Store, table: str
) -> None:
    store.admit(call_request(tool_call_id="in-run", idempotency_key="k1"))
    store.admit(call_request(tool_call_id="no-run", idempotency_key="k2", run_id=None, run_origin=None))

    where, plan = _run_index(store, table)

    assert where is not None and where.strip("()") == "run_id IS NOT NULL"
    assert f"ix_{table}_run_id" in plan
    assert [c.tool_call_id for c in store.run_calls("run-1")] == ["in-run"]
    assert {e.tool_call_id for e in store.events(run_id="run-1")} == {None, "in-run"}  # with run.started
