"""`verify` replays the log into scratch projections and checks the event grammar: projections changed
behind the log's back are named by table, key and column; a forged event that the chain, the head and
the projections all agree with is named by its seq and the rule it breaks; every path the store
writes verifies clean."""

from __future__ import annotations

import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from store import ApprovedDispatch, Store
from store import events as ev
from store.commands import DecideApproval, RevokePrincipal
from store.model import ScratchUnavailable
from store.schema import approvals, effect_ledger, runs, tool_calls
from tests.store import tamper
from tests.store.builders import DENY, NOW, REQUIRE_APPROVAL, call_request, outcome, refusal_request
from tests.store.histories import LATER, SOON, record_every_path


@pytest.fixture
def history(store: Store) -> Store:
    """A short log: a call completed, one denied, one refused in a run of its own (`run-2`), one approved
    by carol and completed (`granted`), one still waiting for its approval (`waiting`)."""
    store.admit(call_request(tool_call_id="ok", idempotency_key="k-ok"))
    store.record_outcome(outcome("ok", "completed", result={"ok": 1}, now=NOW))
    store.admit(call_request(tool_call_id="denied", idempotency_key="k-denied", decision=DENY))
    store.refuse(refusal_request(tool_call_id="refused", run_id="run-2", run_origin="client"))
    store.admit(call_request(tool_call_id="granted", idempotency_key="k-granted", decision=REQUIRE_APPROVAL))
    approval_id = approval_of(store, "granted")
    store.decide_approval(DecideApproval(approval_id, approve=True, decided_by="carol", now=SOON))
    store.dispatch_approved(ApprovedDispatch("granted", now=SOON))
    store.record_outcome(outcome("granted", "completed", now=SOON))
    store.admit(call_request(tool_call_id="waiting", idempotency_key="k-waiting", decision=REQUIRE_APPROVAL))
    return store


def approval_of(store: Store, tool_call_id: str) -> str:
    call = store.get_call(tool_call_id)
    assert call is not None and call.approval_id is not None
    return call.approval_id


def last_seq(store: Store) -> int:
    return store.log_head()[0]


def test_a_log_of_every_path_verifies_clean(store: Store) -> None:
    record_every_path(store)
    history = store
    types = {e.type for e in history.events()}

    report = history.verify()

    assert report.ok, report
    assert (report.replayed, report.projections_compared) == (True, True)
    assert (report.grammar_violation, report.projection_difference, report.differing_tables) == (
        None,
        None,
        (),
    )
    # The history really walks the paths the grammar has rules for.
    assert {
        "approval.granted",
        "approval.rejected",
        "approval.expired",
        "confirmation.given",
        "confirmation.declined",
        "reconciliation.inconclusive",
        "reconciliation.resolved",
        "reconciliation.escalated",
        "reconciliation.contradicted",
        "budget.exceeded",
        "principal.revoked",
        "principal.restored",
    } <= types
    assert any(e.payload.get("supersedes") for e in history.events() if e.type == "tool_call.requested")
    assert any(
        e.payload.get("retry_of_attempt") for e in history.events() if e.type == "tool_call.dispatching"
    )


def test_an_approval_forged_in_the_projections_is_named_by_table_key_and_column(history: Store) -> None:
    approval_id = approval_of(history, "waiting")
    tamper.set_projection(history, approvals, {"approval_id": approval_id}, status="approved")

    report = history.verify()

    assert (report.ok, report.chain_ok) == (False, True)
    difference = report.projection_difference
    assert difference is not None
    assert (difference.table, difference.key, difference.column) == (
        "approvals",
        (("approval_id", approval_id),),
        "status",
    )
    assert (difference.stored, difference.replayed) == ("'approved'", "'awaiting_approval'")
    assert report.grammar_violation is None


def test_a_dispatch_the_forged_approval_let_through_breaks_the_grammar_at_its_seq(history: Store) -> None:
    approval_id = approval_of(history, "waiting")
    tamper.set_projection(history, approvals, {"approval_id": approval_id}, status="approved")
    tamper.set_projection(history, tool_calls, {"tool_call_id": "waiting"}, status="approved")

    history.dispatch_approved(ApprovedDispatch("waiting", now=LATER))  # the resume worker acts on it

    report = history.verify()
    violation = report.grammar_violation
    assert violation is not None
    assert (violation.seq, violation.rule, violation.tool_call_id) == (
        last_seq(history),
        "dispatch_without_approval",
        "waiting",
    )
    assert report.differing_tables == ("approvals",)  # the dispatch moved the call on, in both


def ledger_keys(store: Store) -> list[tuple[str, str, str]]:
    with store.engine.connect() as conn:
        rows = conn.execute(
            select(effect_ledger.c.tenant, effect_ledger.c.subject, effect_ledger.c.idempotency_key)
        )
        return sorted(tuple(r) for r in rows)


def test_an_emptied_effect_ledger_is_named_at_its_first_key(history: Store) -> None:
    tenant, subject, key = ledger_keys(history)[0]
    tamper.delete_projection_rows(history, effect_ledger)

    report = history.verify()

    difference = report.projection_difference
    assert difference is not None
    assert (difference.table, difference.column, difference.stored, difference.replayed) == (
        "effect_ledger",
        None,
        "absent",
        "a row",
    )
    assert difference.key == (("tenant", tenant), ("subject", subject), ("idempotency_key", key))
    assert report.differing_tables == ("effect_ledger",)


def test_a_key_claimed_again_after_the_ledger_was_emptied_is_a_grammar_violation(history: Store) -> None:
    tamper.delete_projection_rows(history, effect_ledger)

    again = history.admit(call_request(tool_call_id="twice", idempotency_key="k-granted", now=LATER))
    assert again.owns_dispatch  # the store, trusting its ledger, lets the refund run a second time

    report = history.verify()
    violation = report.grammar_violation
    assert violation is not None
    requested = next(e for e in history.events(tool_call_id="twice") if e.type == "tool_call.requested")
    assert (violation.seq, violation.rule) == (requested.seq, "key_claimed_twice")
    assert "granted" in violation.detail
    assert not report.ok


def test_an_edited_call_status_is_named_by_its_call(history: Store) -> None:
    tamper.set_projection(history, tool_calls, {"tool_call_id": "granted"}, status="failed")

    report = history.verify()

    difference = report.projection_difference
    assert difference is not None
    assert (difference.table, difference.key, difference.column, difference.stored, difference.replayed) == (
        "tool_calls",
        (("tool_call_id", "granted"),),
        "status",
        "'failed'",
        "'completed'",
    )


def test_a_deleted_runs_row_is_named_by_its_run(history: Store) -> None:
    tamper.delete_projection_rows(history, runs, run_id="run-2")

    report = history.verify()

    difference = report.projection_difference
    assert difference is not None
    assert (difference.table, difference.key, difference.column, difference.stored, difference.replayed) == (
        "runs",
        (("run_id", "run-2"),),
        None,
        "absent",
        "a row",
    )
    assert "runs [run_id=run-2]: stored absent, replayed a row" in difference.describe()


def forged_dispatch(store: Store, tool_call_id: str, attempt: int = 1) -> ev.Envelope:
    call = store.get_call(tool_call_id)
    assert call is not None
    payload = ev.ToolCallDispatching(
        attempt=attempt, idempotency_key=call.idempotency_key, external_request_id=call.external_request_id
    )
    return ev.ToolCallDispatchingEvent(**tamper.envelope_of_call(store, tool_call_id), payload=payload)


def forged_grant(store: Store, tool_call_id: str, by: str) -> ev.Envelope:
    payload = ev.ApprovalDecided(decided_by=by, decided_by_roles=["finance"])
    return ev.ApprovalGrantedEvent(**tamper.envelope_of_call(store, tool_call_id), payload=payload)


def forged_completion(store: Store, tool_call_id: str) -> ev.Envelope:
    payload = ev.ToolCallCompleted(result={"refund_id": "r-forged"})
    return ev.ToolCallCompletedEvent(**tamper.envelope_of_call(store, tool_call_id), payload=payload)


def with_revoked_approver(store: Store) -> ev.Envelope:
    store.revoke_principal(RevokePrincipal("acme", "eve", revoked_by="root", now=LATER + timedelta(1)))
    return forged_grant(store, "waiting", "eve")


FORGERIES: dict[str, tuple[Any, str]] = {
    "a dispatch of a call awaiting approval": (
        lambda s: forged_dispatch(s, "waiting"),
        "dispatch_without_approval",
    ),
    "an approval by the requester": (lambda s: forged_grant(s, "waiting", "alice"), "self_approval"),
    "an approval by a revoked approver": (with_revoked_approver, "approval_by_revoked"),
    "an outcome of a call never dispatched": (
        lambda s: forged_completion(s, "denied"),
        "outcome_without_dispatch",
    ),
    "a second dispatch of a completed call": (lambda s: forged_dispatch(s, "granted", 2), "second_dispatch"),
}


@pytest.mark.parametrize("forgery", FORGERIES)
def test_a_forged_event_resealed_into_the_chain_is_caught_by_the_grammar_alone(
    history: Store, forgery: str
) -> None:
    forge, rule = FORGERIES[forgery]
    forged = forge(history)
    seq = last_seq(history) + 1
    tamper.inject_resealed(history, seq, forged)

    report = history.verify()

    assert (report.chain_ok, report.projections_compared, report.projection_difference) == (True, True, None)
    violation = report.grammar_violation
    assert violation is not None
    assert (violation.seq, violation.rule) == (seq, rule), violation


def test_a_forged_event_inserted_mid_log_is_named_at_its_own_seq(history: Store) -> None:
    required = next(e for e in history.events(tool_call_id="granted") if e.type == "approval.required")
    payload = ev.ToolCallDispatching(attempt=1, idempotency_key="k-granted", external_request_id="x")
    envelope = {**tamper.envelope_of_call(history, "granted"), "occurred_at": required.occurred_at}
    tamper.inject_resealed(
        history, required.seq + 1, ev.ToolCallDispatchingEvent(**envelope, payload=payload)
    )

    report = history.verify()

    assert report.chain_ok
    violation = report.grammar_violation
    assert violation is not None
    assert (violation.seq, violation.rule, violation.tool_call_id) == (
        required.seq + 1,
        "dispatch_without_approval",
        "granted",
    )


def test_verify_leaves_the_live_projections_as_they_were(history: Store) -> None:
    tamper.set_projection(history, tool_calls, {"tool_call_id": "granted"}, status="failed")

    history.verify()

    assert (call := history.get_call("granted")) is not None and call.status == "failed"


def test_no_room_for_the_scratch_projections_is_an_error_not_a_finding(
    history: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-directory"))

    with pytest.raises(ScratchUnavailable, match="point TMPDIR at a directory"):
        history.verify()
