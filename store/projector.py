"""The one projector: folds each event into the projections, live and during rebuild alike."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, bindparam, delete, insert, select, update

from store import events as ev
from store.canonical import canonical_json
from store.model import KeyClaimLost, StoreError
from store.raw import Record, Statement
from store.schema import (
    approvals,
    budget_counters,
    effect_ledger,
    loop_marks,
    revocations,
    runs,
    stored_correlation,
    tool_calls,
)


class Pending:
    """The rows a live append's events insert, held until its flush, and the call rows it wrote.

    A new call's events insert its row and then move it on (`tool_call.dispatching`, `denied`, ...), and
    a new run's row is inserted and then counts the call. Held back, each such row takes the later
    events' values and is written once, by `write`. The replay in `rebuild` holds nothing back and
    writes event by event, to the same rows. Only inserts are held: no event of the same
    transaction reads them before the flush.
    """

    def __init__(self) -> None:
        self.runs: dict[str, dict[str, Any]] = {}
        self.calls: dict[str, dict[str, Any]] = {}
        self.written: dict[str, Record] = {}
        """Each call row this append wrote, as the database returned it: the caller's view needs no reload."""

    def write(self, conn: Connection) -> None:
        for run in self.runs.values():
            _INSERT_RUN.execute(conn, run)
        for tool_call_id, call in self.calls.items():
            self.written[tool_call_id] = _INSERT_CALL_RETURNING.one(conn, call)
        self.runs.clear()
        self.calls.clear()


def apply(conn: Connection, event: ev.Event, pending: Pending | None = None) -> None:
    """Bring the projections up to date with one appended event; with `pending`, hold its inserts there.

    Raises:
        KeyClaimLost: the event takes over a key that another call holds by now.
    """
    handler = _HANDLERS.get(event.type)
    if handler is not None:
        handler(conn, event, pending)


# The statements every call runs, built once and run on the raw cursor (store.raw): compiled once per
# dialect and set of parameter names, so only the parameters change per event. An UPDATE without
# .values() sets the columns named by its parameters; the WHERE binds are named b_* so they never
# collide with a column.
_INSERT_RUN = Statement(runs.insert())
_COUNT_CALL = Statement(
    update(runs).where(runs.c.run_id == bindparam("b_run_id")).values(call_count=runs.c.call_count + 1)
)
_SET_RUN = Statement(update(runs).where(runs.c.run_id == bindparam("b_run_id")))
_INSERT_CALL = Statement(tool_calls.insert())
_INSERT_CALL_RETURNING = Statement(tool_calls.insert().returning(*tool_calls.c))
_UPDATE_CALL = Statement(update(tool_calls).where(tool_calls.c.tool_call_id == bindparam("b_tool_call_id")))
_UPDATE_CALL_RETURNING = Statement(
    update(tool_calls)
    .where(tool_calls.c.tool_call_id == bindparam("b_tool_call_id"))
    .returning(*tool_calls.c)
)
# A dispatch sent the key scoped when it differs from the call's own (store.keys): the event names the
# key as sent and the row holds the client's, so the database compares them, with no read first.
_SENT_KEY = bindparam("b_sent_key", type_=tool_calls.c.idempotency_key.type)
_DISPATCH_CALL = Statement(
    update(tool_calls)
    .where(tool_calls.c.tool_call_id == bindparam("b_tool_call_id"))
    .values(key_scoped=tool_calls.c.idempotency_key != _SENT_KEY)
)
_DISPATCH_CALL_RETURNING = Statement(
    update(tool_calls)
    .where(tool_calls.c.tool_call_id == bindparam("b_tool_call_id"))
    .values(key_scoped=tool_calls.c.idempotency_key != _SENT_KEY)
    .returning(*tool_calls.c)
)
_INSERT_APPROVAL = Statement(approvals.insert())
_UPDATE_APPROVAL = Statement(update(approvals).where(approvals.c.approval_id == bindparam("b_approval_id")))
_CLAIM_KEY = Statement(effect_ledger.insert())
_TAKE_OVER_KEY = Statement(
    update(effect_ledger).where(
        effect_ledger.c.tenant == bindparam("b_tenant"),
        effect_ledger.c.subject == bindparam("b_subject"),
        effect_ledger.c.idempotency_key == bindparam("b_idempotency_key"),
        effect_ledger.c.tool_call_id == bindparam("b_supersedes"),
    )
)

# Every writer holds the head lock, so no other transaction inserts a counter between the update that
# finds none and the insert: no upsert syntax per dialect is needed.
_ADD_TO_COUNTER = Statement(
    update(budget_counters)
    .where(budget_counters.c.counter_key == bindparam("b_counter_key"))
    .values(used_micros=budget_counters.c.used_micros + bindparam("b_amount_micros"))
)
_INSERT_COUNTER = Statement(budget_counters.insert())
_INSERT_LOOP_MARK = Statement(loop_marks.insert())


def _json(value: Any) -> str | None:
    return None if value is None else canonical_json(value)


def _named(event: ev.Envelope, field: str, value: str | None) -> str:
    # Without the id its row is keyed by, an update would match no row and the event project nowhere.
    if value is None:
        raise StoreError(f"event {event.event_id} ({type(event).__name__}) has no {field}")
    return value


def _update_call(
    conn: Connection,
    pending: Pending | None,
    event: ev.Envelope,
    sent_key: str | None = None,
    **values: Any,
) -> None:
    """Set `values` on the event's call row; with `sent_key` (a dispatch's), also whether it is scoped."""
    tool_call_id = _named(event, "tool_call_id", event.tool_call_id)
    values["updated_at"] = ev.parse_ts(event.occurred_at)
    values["last_event_id"] = event.event_id
    held = pending.calls.get(tool_call_id) if pending is not None else None
    if held is not None:
        if sent_key is not None:
            values["key_scoped"] = held["idempotency_key"] != sent_key
        held.update(values)
        return
    params = {"b_tool_call_id": tool_call_id, **values}
    plain, returning = _UPDATE_CALL, _UPDATE_CALL_RETURNING
    if sent_key is not None:
        params["b_sent_key"] = sent_key
        plain, returning = _DISPATCH_CALL, _DISPATCH_CALL_RETURNING
    if pending is None:
        plain.execute(conn, params)
        return
    row = returning.one_or_none(conn, params)
    if row is not None:
        pending.written[tool_call_id] = row


def _update_approval(conn: Connection, event: ev.Envelope, **values: Any) -> None:
    _UPDATE_APPROVAL.execute(conn, {"b_approval_id": event.approval_id, **values})


def _insert(
    conn: Connection, held: dict[str, dict[str, Any]] | None, key: str, statement: Statement, row: Any
) -> None:
    # A key held already is inserted at once, so that the database refuses the duplicate as before.
    if held is None or key in held:
        statement.execute(conn, row)
    else:
        held[key] = row


def _run_started(conn: Connection, event: ev.RunStartedEvent, pending: Pending | None) -> None:
    run_id = _named(event, "run_id", event.run_id)
    run = {
        "run_id": run_id,
        "tenant": event.payload.tenant,
        "subject": event.payload.subject,
        "started_at": ev.parse_ts(event.occurred_at),
        "call_count": 0,
        "origin": event.payload.origin,
        "status": "active",
        "stopped_at": None,
        "stopped_by": None,
        "stop_reason": None,
    }
    _insert(conn, None if pending is None else pending.runs, run_id, _INSERT_RUN, run)


def _run_stopped(conn: Connection, event: ev.RunStoppedEvent, pending: Pending | None) -> None:
    p = event.payload
    values = {
        "status": "stopped",
        "stopped_at": ev.parse_ts(event.occurred_at),
        "stopped_by": p.stopped_by,
        "stop_reason": p.reason,
    }
    _SET_RUN.execute(conn, {"b_run_id": _named(event, "run_id", event.run_id), **values})


def _run_resumed(conn: Connection, event: ev.RunResumedEvent, pending: Pending | None) -> None:
    # The last stop stays on the row (who, when, why) until the next one; the log holds them all.
    _SET_RUN.execute(conn, {"b_run_id": _named(event, "run_id", event.run_id), "status": "active"})


def _requested(conn: Connection, event: ev.ToolCallRequestedEvent, pending: Pending | None) -> None:
    p = event.payload
    at = ev.parse_ts(event.occurred_at)
    tool_call_id = _named(event, "tool_call_id", event.tool_call_id)
    run_id = event.run_id  # None: a call in no run
    call = {
        "tool_call_id": tool_call_id,
        "run_id": run_id,
        "tenant": event.tenant,
        "subject": p.subject,
        "principal": _json(p.principal),
        "tool_name": p.tool_name,
        "capability_id": event.capability_id or "",
        "capability_version": event.capability_version or "",
        "action_hash": p.action_hash,
        "idempotency_key": p.idempotency_key,
        "key_source": p.key_source,
        "status": "requested",
        "verification_status": "not_observed",
        "decision_effect": str(p.decision.get("effect", "deny")),
        "reason": p.decision.get("reason"),
        "policy_version": event.policy_version or "",
        "arguments": _json(p.arguments),
        "summary": p.summary,
        "effect_class": p.effect_class,
        "external_request_id": p.external_request_id,
        "attempts": 0,
        "lease_token": 0,
        "reconcile_attempts": 0,
        "dedupe_window_s": p.dedupe_window_s,
        "contract_hash": p.contract_hash,
        "correlation_id": stored_correlation(event.correlation_id, tool_call_id),
        "last_event_id": event.event_id,
        "created_at": at,
        "updated_at": at,
    }
    _insert(conn, None if pending is None else pending.calls, tool_call_id, _INSERT_CALL, call)
    run = pending.runs.get(run_id) if pending is not None and run_id is not None else None
    if run is not None:
        run["call_count"] += 1
    elif run_id is not None:
        _COUNT_CALL.execute(conn, {"b_run_id": run_id})
    for charge in p.charges or ():
        _charge(conn, event, charge)
    for mark in p.loops or ():
        _mark_loop(conn, event, mark.key, "call", mark.resets_at)
    if not p.claims_key:
        return
    claim = {
        "tool_call_id": tool_call_id,
        "action_hash": p.action_hash,
        "key_source": p.key_source,
        "claimed_at": at,
    }
    if p.supersedes is None:
        # A second claimant fails here on the primary key: uniqueness lives in the database.
        key = {"tenant": event.tenant, "subject": p.subject, "idempotency_key": p.idempotency_key}
        _CLAIM_KEY.execute(conn, {**key, **claim})
        return
    taken = _TAKE_OVER_KEY.execute(
        conn,
        {
            "b_tenant": event.tenant,
            "b_subject": p.subject,
            "b_idempotency_key": p.idempotency_key,
            "b_supersedes": p.supersedes,
            **claim,
        },
    )
    if taken != 1:
        raise KeyClaimLost(f"key {p.idempotency_key!r} is no longer held by call {p.supersedes}")


def _charge(conn: Connection, event: ev.Envelope, charge: ev.BudgetCharged) -> None:
    added = _ADD_TO_COUNTER.execute(
        conn, {"b_counter_key": charge.key, "b_amount_micros": charge.amount_micros}
    )
    if added == 0:
        counter = {
            "counter_key": charge.key,
            "budget_id": charge.budget,
            "tenant": event.tenant or "",
            "used_micros": charge.amount_micros,
            "window_start": None if charge.window_start is None else ev.parse_ts(charge.window_start),
            "resets_at": None if charge.resets_at is None else ev.parse_ts(charge.resets_at),
        }
        _INSERT_COUNTER.execute(conn, counter)


def _mark_loop(conn: Connection, event: ev.Envelope, key: str, kind: str, resets_at: str | None) -> None:
    row = {
        "pattern_key": key,
        "tool_call_id": event.tool_call_id or "",
        "kind": kind,
        "tenant": event.tenant or "",
        "seq": event.seq,
        "resets_at": _ts(resets_at),
    }
    _INSERT_LOOP_MARK.execute(conn, row)


def _loop_detected(conn: Connection, event: ev.LoopDetectedEvent, pending: Pending | None) -> None:
    # Marks the pattern as found: its later calls in the window are refused without another event.
    if event.payload.key is not None:
        _mark_loop(conn, event, event.payload.key, "detected", event.payload.resets_at)


def _denied(conn: Connection, event: ev.ToolCallDeniedEvent, pending: Pending | None) -> None:
    p = event.payload
    # The policy the denial was made under: an approved call refused at execution names the policy in
    # force then, not the request's (`store.approving.deny`).
    version = {"policy_version": event.policy_version} if event.policy_version is not None else {}
    _update_call(
        conn,
        pending,
        event,
        status="denied",
        decision_effect="deny",
        reason=p.reason,
        error=p.message or p.detail,
        **version,
    )


def _approval_required(conn: Connection, event: ev.ApprovalRequiredEvent, pending: Pending | None) -> None:
    p = event.payload
    _INSERT_APPROVAL.execute(
        conn,
        {
            "approval_id": p.approval_id,
            "tool_call_id": event.tool_call_id,
            "tenant": event.tenant,
            "status": "awaiting_approval",
            "requester": p.requester,
            "approver_role": p.approver_role,
            "requester_may_approve": p.requester_may_approve,
            "action_hash": p.action_hash,
            "expires_at": ev.parse_ts(p.expires_at),
            "created_at": ev.parse_ts(event.occurred_at),
        },
    )
    _update_call(
        conn,
        pending,
        event,
        status="approval_pending",
        approval_id=p.approval_id,
        approval_expires_at=ev.parse_ts(p.expires_at),
    )


def _approval_decided(status: str) -> Callable[[Connection, Any, Pending | None], None]:
    def handle(
        conn: Connection, event: ev.ApprovalGrantedEvent | ev.ApprovalRejectedEvent, pending: Pending | None
    ) -> None:
        at = ev.parse_ts(event.occurred_at)
        p = event.payload
        _update_approval(conn, event, status=status, decided_by=p.decided_by, decided_at=at, reason=p.reason)
        _update_call(conn, pending, event, status=status)

    return handle


def _approval_expired(conn: Connection, event: ev.ApprovalExpiredEvent, pending: Pending | None) -> None:
    at = ev.parse_ts(event.occurred_at)
    _update_approval(conn, event, status="expired", decided_at=at, reason=event.payload.reason)
    _update_call(conn, pending, event, status="expired")


def _confirmation_required(
    conn: Connection, event: ev.ConfirmationRequiredEvent, pending: Pending | None
) -> None:
    p = event.payload
    _update_call(
        conn,
        pending,
        event,
        status="awaiting_confirmation",
        confirmation_id=p.confirmation_id,
        confirmation_expires_at=ev.parse_ts(p.expires_at),
    )


def _confirmation_given(conn: Connection, event: ev.ConfirmationGivenEvent, pending: Pending | None) -> None:
    # The `tool_call.dispatching` appended with it moves the call on.
    _update_call(conn, pending, event)


def _confirmation_declined(
    conn: Connection, event: ev.ConfirmationDeclinedEvent, pending: Pending | None
) -> None:
    reason = "user_cancelled" if event.payload.action == "cancel" else "user_declined"
    _update_call(conn, pending, event, status="denied", reason=reason)


def _confirmation_expired(
    conn: Connection, event: ev.ConfirmationExpiredEvent, pending: Pending | None
) -> None:
    # Withdrawn because its run was stopped, or expired unanswered (the only cause before runs stopped).
    stopped = event.payload.reason == "run_stopped"
    _update_call(
        conn, pending, event, status="expired", reason="run_stopped" if stopped else "confirmation_expired"
    )


def _ts(text: str | None) -> Any:
    return None if text is None else ev.parse_ts(text)


# Settling a call ends its lease but keeps the token: tokens only grow, so an old holder stays fenced.
_NO_LEASE: dict[str, Any] = {"lease_owner": None, "lease_expires_at": None}


def _dispatching(conn: Connection, event: ev.ToolCallDispatchingEvent, pending: Pending | None) -> None:
    p = event.payload
    _update_call(
        conn,
        pending,
        event,
        sent_key=p.idempotency_key,
        status="dispatching",
        attempts=p.attempt,
        external_request_id=p.external_request_id,
        lease_owner=p.lease_owner or None,
        lease_token=p.fencing_token,
        lease_expires_at=_ts(p.lease_expires_at),
        next_reconcile_at=None,
    )
    for charge in p.charges or ():
        _charge(conn, event, charge)


def _completed(conn: Connection, event: ev.ToolCallCompletedEvent, pending: Pending | None) -> None:
    _update_call(
        conn,
        pending,
        event,
        status="completed",
        verification_status="not_observed",
        result=_json(event.payload.result),
        error=None,
        **_NO_LEASE,
    )


def _failed(conn: Connection, event: ev.ToolCallFailedEvent, pending: Pending | None) -> None:
    p = event.payload
    _update_call(conn, pending, event, status="failed", result=_json(p.result), error=p.error, **_NO_LEASE)


def _result_unknown(conn: Connection, event: ev.ToolCallResultUnknownEvent, pending: Pending | None) -> None:
    # Due for reconciliation at once.
    _update_call(
        conn,
        pending,
        event,
        status="result_unknown",
        verification_status="pending",
        error=event.payload.error,
        next_reconcile_at=ev.parse_ts(event.occurred_at),
        **_NO_LEASE,
    )


def _reconciliation_started(
    conn: Connection, event: ev.ReconciliationStartedEvent, pending: Pending | None
) -> None:
    p = event.payload
    # A re-check of a `failed` verdict leaves it confirmed while it looks; an unknown call is pending.
    verification = {} if p.method == ev.RECHECK else {"verification_status": "pending"}
    _update_call(
        conn,
        pending,
        event,
        **verification,
        reconcile_attempts=p.attempt,
        lease_owner=p.lease_owner or None,
        lease_token=p.fencing_token,
        lease_expires_at=_ts(p.lease_expires_at),
    )


def _reconciliation_inconclusive(
    conn: Connection, event: ev.ReconciliationInconclusiveEvent, pending: Pending | None
) -> None:
    _update_call(
        conn, pending, event, next_reconcile_at=ev.parse_ts(event.payload.next_attempt_at), **_NO_LEASE
    )


def _reconciliation_rechecked(
    conn: Connection, event: ev.ReconciliationRecheckedEvent, pending: Pending | None
) -> None:
    # After the last re-check of a `failed` verdict, nothing more is due.
    next_at = event.payload.next_recheck_at
    _update_call(
        conn, pending, event, next_reconcile_at=ev.parse_ts(next_at) if next_at else None, **_NO_LEASE
    )


def _reconciliation_resolved(
    conn: Connection, event: ev.ReconciliationResolvedEvent, pending: Pending | None
) -> None:
    p = event.payload
    values: dict[str, Any] = {
        "status": "completed" if p.verdict == "confirmed_success" else "failed",
        "verification_status": p.verdict,
        "resolved_by": p.resolved_by,
        # A failure found by looking after the horizon is looked up again from then (`recheck_at`).
        "next_reconcile_at": ev.parse_ts(p.recheck_at) if p.recheck_at else None,
        **_NO_LEASE,
    }
    if p.verdict == "confirmed_failure":
        # How the failure was established, so what the model is told matches what Writ knows.
        values["error"] = _failure_basis(p)
    if p.result is not None:
        values["result"] = _json(p.result)
    _update_call(conn, pending, event, **values)


def _failure_basis(p: ev.ReconciliationResolved) -> str:
    if p.resolved_by is not None:
        return "resolved_failed_by_hand"
    if p.evidence.get("verdict") == "not_found":
        return "no_effect_after_horizon"
    return "backend_reported_failure"


def _reconciliation_escalated(
    conn: Connection, event: ev.ReconciliationEscalatedEvent, pending: Pending | None
) -> None:
    _update_call(
        conn, pending, event, verification_status="inconclusive", next_reconcile_at=None, **_NO_LEASE
    )


def _reconciliation_contradicted(
    conn: Connection, event: ev.ReconciliationContradictedEvent, pending: Pending | None
) -> None:
    # The status stays what was settled; only the claim that it was confirmed is withdrawn. Its
    # re-checks end, and so does the lease of the re-check that found it, if one did.
    _update_call(
        conn, pending, event, verification_status="inconclusive", next_reconcile_at=None, **_NO_LEASE
    )


# budget.exceeded is a judgment fact with no projection of its own; oauth.client_revoked neither (the
# authorization server's records are not projections: the revocation is applied when it is recorded).
def _principal_revoked(conn: Connection, event: ev.PrincipalRevokedEvent, pending: Pending | None) -> None:
    # A second revocation of the same subject is recorded in the log; the first one stands here.
    exists = conn.execute(
        select(revocations.c.subject).where(
            revocations.c.tenant == event.tenant, revocations.c.subject == event.payload.subject
        )
    ).first()
    if exists is None:
        conn.execute(
            insert(revocations).values(
                tenant=event.tenant,
                subject=event.payload.subject,
                revoked_at=ev.parse_ts(event.occurred_at),
                revoked_by=event.payload.revoked_by,
                reason=event.payload.reason,
                event_id=event.event_id,
            )
        )


def _principal_restored(conn: Connection, event: ev.PrincipalRestoredEvent, pending: Pending | None) -> None:
    # Standing is back: a later revocation of the subject starts a new row.
    conn.execute(
        delete(revocations).where(
            revocations.c.tenant == event.tenant, revocations.c.subject == event.payload.subject
        )
    )


def _retry_requested(
    conn: Connection, event: ev.ToolCallRetryRequestedEvent, pending: Pending | None
) -> None:
    """Nothing to project: the failed call stays failed; its retry is a call of its own, linked both
    ways in the log (this event names the retry, the retry's request names this call)."""


_HANDLERS: dict[str, Callable[[Connection, Any, Pending | None], None]] = {
    "run.started": _run_started,
    "tool_call.requested": _requested,
    "tool_call.denied": _denied,
    "approval.required": _approval_required,
    "approval.granted": _approval_decided("approved"),
    "approval.rejected": _approval_decided("rejected"),
    "approval.expired": _approval_expired,
    "confirmation.required": _confirmation_required,
    "confirmation.given": _confirmation_given,
    "confirmation.declined": _confirmation_declined,
    "confirmation.expired": _confirmation_expired,
    "tool_call.dispatching": _dispatching,
    "tool_call.completed": _completed,
    "tool_call.failed": _failed,
    "tool_call.result_unknown": _result_unknown,
    "reconciliation.started": _reconciliation_started,
    "reconciliation.inconclusive": _reconciliation_inconclusive,
    "reconciliation.rechecked": _reconciliation_rechecked,
    "reconciliation.resolved": _reconciliation_resolved,
    "reconciliation.escalated": _reconciliation_escalated,
    "reconciliation.contradicted": _reconciliation_contradicted,
    "loop.detected": _loop_detected,
    "principal.revoked": _principal_revoked,
    "principal.restored": _principal_restored,
    "run.stopped": _run_stopped,
    "run.resumed": _run_resumed,
    "tool_call.retry_requested": _retry_requested,
}
