"""Settling `result_unknown` calls: reconciliation leases, lookups' verdicts, retries, and humans.

Each function is one transaction's worth of recording, run under the log-head lock. A reconciler first
takes a lease (`reconciliation.started`, a new fencing token); everything it records afterwards needs
that token, so two replicas never settle one call twice and a paused reconciler cannot overwrite a
newer verdict. A person may settle an unknown call at any time; that moves its status on, which fences
any reconciler still holding a lease.

A `failed` that rests on finding nothing after the commit horizon is re-checked a few times
(`recheck_at` of its `reconciliation.resolved`): under a lease of the same kind (`reconciliation.started`
with method `recheck`), a lookup that again finds nothing is `reconciliation.rechecked` naming the
next re-check (none after the last), and one that finds the effect is `reconciliation.contradicted`.
The call stays `failed` throughout; a contradiction, or a person's resolution, ends the re-checks.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, and_, or_, select

from store import events as ev
from store.commands import (
    EscalateReconciliation,
    RecordContradiction,
    RecordInconclusive,
    RecordRecheck,
    Redispatch,
    ResolveManually,
    ResolveReconciliation,
    StartReconciliation,
    Verdict,
)
from store.keys import sent_key
from store.leasing import call_envelope, call_row, fenced, grant
from store.log import Append
from store.model import CallView, NotFound, StaleLease, StoreError
from store.raw import Record
from store.schema import events, tool_calls
from store.views import call_view


def due_for_lookup(now: Any) -> tuple[Any, ...]:
    """Unknown calls waiting for a lookup at `now` (a datetime, or a bound parameter): not escalated,
    not leased, and past their backoff."""
    c = tool_calls.c
    return (
        c.status == "result_unknown",
        c.verification_status == "pending",
        or_(c.next_reconcile_at.is_(None), c.next_reconcile_at <= now),
        or_(c.lease_expires_at.is_(None), c.lease_expires_at < now),
    )


def due_for_recheck(now: Any) -> tuple[Any, ...]:
    """`failed` calls whose verdict (nothing found after the commit horizon) is due to be looked up
    again at `now`: a re-check scheduled and past, not contradicted, not leased."""
    c = tool_calls.c
    return (
        c.next_reconcile_at <= now,
        c.status == "failed",
        c.verification_status == "confirmed_failure",
        or_(c.lease_expires_at.is_(None), c.lease_expires_at < now),
    )


def due(conn: Connection, *, now: datetime, limit: int) -> list[CallView]:
    """Unknown calls waiting for a lookup (`due_for_lookup`) and failures due for a re-check
    (`due_for_recheck`), the longest waiting first."""
    c = tool_calls.c
    query = (
        select(tool_calls)
        .where(or_(and_(*due_for_lookup(now)), and_(*due_for_recheck(now))))
        .order_by(c.next_reconcile_at, c.tool_call_id)
        .limit(limit)
    )
    return [call_view(row) for row in conn.execute(query)]


def start(conn: Connection, cmd: StartReconciliation, *, producer: str) -> CallView:
    """Take the reconciliation lease of an unknown call, or with method `recheck` the re-check lease of
    a failure due to be looked up again (compare-and-set on its fencing token).

    Raises:
        NotFound: no such call.
        StaleLease: settled, escalated, leased by someone else, or its token moved on; for a re-check:
            not failed, contradicted, or no re-check scheduled.
    """
    log = Append(conn)
    if cmd.method == ev.RECHECK:
        row = fenced(conn, cmd.tool_call_id, cmd.expected_token, "failed")
        if row.verification_status != "confirmed_failure" or row.next_reconcile_at is None:
            raise StaleLease(f"call {cmd.tool_call_id} has no re-check scheduled")
    else:
        row = fenced(conn, cmd.tool_call_id, cmd.expected_token, "result_unknown")
        if row.verification_status != "pending":
            raise StaleLease(
                f"call {cmd.tool_call_id} is {row.verification_status}, not awaiting reconciliation"
            )
    if row.lease_expires_at is not None and row.lease_expires_at >= cmd.now:
        raise StaleLease(f"call {cmd.tool_call_id} is being reconciled by {row.lease_owner}")
    payload = ev.ReconciliationStarted(
        method=cmd.method,
        attempt=row.reconcile_attempts + 1,
        **grant(cmd.owner, row.lease_token, cmd.now, cmd.lease_s),
    )
    log.add(ev.ReconciliationStartedEvent(**call_envelope(row, cmd.now, producer), payload=payload))
    log.flush()
    return log.call(cmd.tool_call_id)


def inconclusive(conn: Connection, cmd: RecordInconclusive, *, producer: str) -> CallView:
    """Record a lookup that could not tell, and when to try again; the lease ends.

    Raises:
        NotFound, StaleLease.
    """
    log = Append(conn)
    row = fenced(conn, cmd.tool_call_id, cmd.token, "result_unknown")
    payload = ev.ReconciliationInconclusive(
        attempt=row.reconcile_attempts,
        evidence=dict(cmd.evidence),
        next_attempt_at=ev.format_ts(cmd.next_attempt_at),
    )
    log.add(ev.ReconciliationInconclusiveEvent(**call_envelope(row, cmd.now, producer), payload=payload))
    log.flush()
    return log.call(cmd.tool_call_id)


def rechecked(conn: Connection, cmd: RecordRecheck, *, producer: str) -> CallView:
    """Record a re-check that found no effect of the call (`reconciliation.rechecked`: the verdict
    stands) and the next re-check, if any; the lease ends.

    Raises:
        NotFound: no such call.
        StaleLease: not failed, its token moved on, or its failure was contradicted meanwhile.
    """
    log = Append(conn)
    row = _rechecking(conn, cmd.tool_call_id, cmd.token)
    payload = ev.ReconciliationRechecked(
        attempt=row.reconcile_attempts,
        evidence=dict(cmd.evidence),
        next_recheck_at=ev.format_ts(cmd.next_recheck_at) if cmd.next_recheck_at is not None else None,
    )
    log.add(ev.ReconciliationRecheckedEvent(**call_envelope(row, cmd.now, producer), payload=payload))
    log.flush()
    return log.call(cmd.tool_call_id)


def _rechecking(conn: Connection, tool_call_id: str, token: int) -> Record:
    """The call's row, if `token` is its current re-check lease and its failure still stands.

    Raises:
        NotFound, StaleLease.
    """
    row = fenced(conn, tool_call_id, token, "failed")
    if row.verification_status != "confirmed_failure":
        # A late answer or a person contradicted it meanwhile, which keeps the token: this lease
        # may no longer schedule or record anything.
        raise StaleLease(f"call {tool_call_id} is failed but {row.verification_status}")
    return row


def resolve(conn: Connection, cmd: ResolveReconciliation, *, producer: str) -> CallView:
    """Record the backend's answer: the call becomes `completed` or `failed`, verification confirmed.

    Raises:
        NotFound, StaleLease.
        StoreError: a re-check scheduled for a success.
    """
    if cmd.recheck_at is not None and cmd.verdict != "confirmed_failure":
        raise StoreError("only a failure is re-checked; a found effect is final")
    log = Append(conn)
    row = fenced(conn, cmd.tool_call_id, cmd.token, "result_unknown")
    payload = ev.ReconciliationResolved(
        verdict=cmd.verdict,
        result=dict(cmd.result) if cmd.result is not None else None,
        evidence=dict(cmd.evidence),
        detail=cmd.detail,
        recheck_at=ev.format_ts(cmd.recheck_at) if cmd.recheck_at is not None else None,
    )
    log.add(ev.ReconciliationResolvedEvent(**call_envelope(row, cmd.now, producer), payload=payload))
    log.flush()
    return log.call(cmd.tool_call_id)


def escalate(conn: Connection, cmd: EscalateReconciliation, *, producer: str) -> CallView:
    """Hand the call to a human: it stays `result_unknown`, verification `inconclusive`.

    Raises:
        NotFound, StaleLease.
    """
    log = Append(conn)
    row = fenced(conn, cmd.tool_call_id, cmd.token, "result_unknown")
    payload = ev.ReconciliationEscalated(
        reason=cmd.reason, detail=cmd.detail, attempts=row.reconcile_attempts, evidence=dict(cmd.evidence)
    )
    log.add(ev.ReconciliationEscalatedEvent(**call_envelope(row, cmd.now, producer), payload=payload))
    log.flush()
    return log.call(cmd.tool_call_id)


def redispatch(conn: Connection, cmd: Redispatch, *, producer: str) -> CallView:
    """Re-send with the same key (only for backends that deduplicate on it): a new attempt and lease.

    Raises:
        NotFound, StaleLease.
    """
    log = Append(conn)
    row = fenced(conn, cmd.tool_call_id, cmd.token, "result_unknown")
    # The key the backend got the last time, or it would not know the request again: scoped, or plain
    # for a call first dispatched before keys were scoped.
    payload = ev.ToolCallDispatching(
        attempt=row.attempts + 1,
        idempotency_key=sent_key(row.tenant, row.subject, row.idempotency_key, scoped=row.key_scoped),
        external_request_id=row.external_request_id,
        retry_of_attempt=row.attempts,
        **grant(cmd.owner, row.lease_token, cmd.now, cmd.lease_s),
    )
    log.add(ev.ToolCallDispatchingEvent(**call_envelope(row, cmd.now, producer), payload=payload))
    log.flush()
    return log.call(cmd.tool_call_id)


SETTLED_EVENTS = ("tool_call.completed", "tool_call.failed", "reconciliation.resolved")


def contradict(conn: Connection, cmd: RecordContradiction, *, producer: str) -> CallView | None:
    """Record evidence that disagrees with the call's settled verdict, with the settled verdict's own
    evidence beside it; the call keeps its status and waits for a person. None (nothing recorded) when
    the call is not settled or the evidence agrees. With `token` (a re-check's lookup), only under
    that re-check lease, while the failure stands.

    Raises:
        NotFound: no such call.
        StaleLease: `token` given, and it is not the call's current re-check lease over a standing
            failure.
    """
    log = Append(conn)
    tool_call_id = cmd.tool_call_id
    row = call_row(conn, tool_call_id) if cmd.token is None else _rechecking(conn, tool_call_id, cmd.token)
    agrees = "completed" if cmd.verdict == "confirmed_success" else "failed"
    if row.status not in ("completed", "failed") or row.status == agrees:
        return None
    settled = conn.execute(
        select(events.c.event_id, events.c.payload)
        .where(events.c.tool_call_id == tool_call_id, events.c.type.in_(SETTLED_EVENTS))
        .order_by(events.c.seq.desc())
        .limit(1)
    ).first()
    settled_payload = json.loads(settled.payload) if settled is not None else {}
    payload = ev.ReconciliationContradicted(
        source=cmd.source,
        settled_status=row.status,
        settled_verification=row.verification_status,
        settled_event_id=settled.event_id if settled is not None else None,
        settled_evidence=_evidence_of(settled_payload),
        verdict=cmd.verdict,
        evidence=dict(cmd.evidence),
        detail=cmd.detail,
        by=cmd.by,
    )
    log.add(ev.ReconciliationContradictedEvent(**call_envelope(row, cmd.now, producer), payload=payload))
    log.flush()
    return log.call(tool_call_id)


def _evidence_of(payload: Mapping[str, Any]) -> dict[str, Any]:
    evidence = dict(payload.get("evidence") or {})
    for name in ("error", "detail", "resolved_by"):
        if payload.get(name) is not None:
            evidence.setdefault(name, payload[name])
    return evidence


def resolve_by_human(conn: Connection, cmd: ResolveManually, *, producer: str) -> CallView:
    """A person settles an unknown or contradicted call with their evidence, or contradicts a settled
    one; recorded with who.

    Raises:
        NotFound: no such call (in `tenant`, when given).
        StaleLease: the call is settled and the person agrees with it (nothing to record).
    """
    log = Append(conn)
    tool_call_id, evidence, by = cmd.tool_call_id, cmd.evidence, cmd.by
    row = call_row(conn, tool_call_id)
    if cmd.tenant is not None and row.tenant != cmd.tenant:
        raise NotFound(f"no tool call {tool_call_id}")
    if not evidence.strip() or not by.strip():
        raise StoreError("a manual resolution needs evidence and the name of who resolved it")
    verdict: Verdict = "confirmed_success" if cmd.succeeded else "confirmed_failure"
    contradicted = row.status in ("completed", "failed") and row.verification_status == "inconclusive"
    if row.status != "result_unknown" and not contradicted:
        # A person disagreeing with a settled verdict is a contradiction: recorded and escalated
        # beside the verdict, which is not overwritten. Agreeing with it changes nothing.
        contradiction = RecordContradiction(
            tool_call_id,
            source="resolution",
            verdict=verdict,
            evidence={"manual": evidence},
            detail=f"contradicted by {by}",
            now=cmd.now,
            by=by,
        )
        call = contradict(conn, contradiction, producer=producer)
        if call is None:
            raise StaleLease(
                f"call {tool_call_id} is {row.status}: nothing unknown to settle, nothing to contradict"
            )
        return call
    # A person's `failed` frees the key for a retry, and the backend may yet commit what it had not
    # when they looked: a call Writ could look up is looked up once more, now, as a failure found
    # after the horizon is (`reconciliation.rechecked`; the reconciler schedules any later re-check).
    # Not a contradicted call: the person has just overruled what a lookup found.
    recheck = verdict == "confirmed_failure" and not contradicted and _looked_up(conn, tool_call_id)
    payload = ev.ReconciliationResolved(
        verdict=verdict,
        evidence={"manual": evidence},
        detail=f"resolved by {by}",
        resolved_by=by,
        break_glass=cmd.break_glass,
        reason=cmd.reason,
        recheck_at=ev.format_ts(cmd.now) if recheck else None,
    )
    log.add(ev.ReconciliationResolvedEvent(**call_envelope(row, cmd.now, producer), payload=payload))
    log.flush()
    return log.call(tool_call_id)


def _looked_up(conn: Connection, tool_call_id: str) -> bool:
    """Whether the reconciler ever looked the call's outcome up at its backend."""
    started = conn.execute(
        select(events.c.payload).where(
            events.c.tool_call_id == tool_call_id, events.c.type == "reconciliation.started"
        )
    )
    return any(json.loads(row.payload).get("method") == "lookup" for row in started)
