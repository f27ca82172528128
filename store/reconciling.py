"""Settling `result_unknown` calls: reconciliation leases, lookups' verdicts, retries, and humans.

Each function is one transaction's worth of recording, run under the log-head lock. A reconciler first
takes a lease (`reconciliation.started`, a new fencing token); everything it records afterwards needs
that token, so two replicas never settle one call twice and a paused reconciler cannot overwrite a
newer verdict. A person may settle an unknown call at any time; that moves its status on, which fences
any reconciler still holding a lease.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import Connection, or_, select

from store import events as ev
from store.leasing import call_envelope, call_row, fenced, grant
from store.log import Append
from store.model import CallView, NotFound, StaleLease, StoreError
from store.schema import events, tool_calls
from store.views import call_view

Verdict = Literal["confirmed_success", "confirmed_failure"]


def due(conn: Connection, *, now: datetime, limit: int) -> list[CallView]:
    """Unknown calls waiting for a lookup: not escalated, not leased, and past their backoff."""
    c = tool_calls.c
    query = (
        select(tool_calls)
        .where(
            c.status == "result_unknown",
            c.verification_status == "pending",
            or_(c.next_reconcile_at.is_(None), c.next_reconcile_at <= now),
            or_(c.lease_expires_at.is_(None), c.lease_expires_at < now),
        )
        .order_by(c.next_reconcile_at, c.tool_call_id)
        .limit(limit)
    )
    return [call_view(row) for row in conn.execute(query)]


def start(
    conn: Connection,
    tool_call_id: str,
    *,
    expected_token: int,
    method: str,
    owner: str,
    lease_s: float,
    now: datetime,
    producer: str,
) -> CallView:
    """Take the reconciliation lease of an unknown call (compare-and-set on its fencing token).

    Raises:
        NotFound: no such call.
        StaleLease: settled, escalated, leased by someone else, or its token moved on.
    """
    log = Append(conn)
    row = fenced(conn, tool_call_id, expected_token, "result_unknown")
    if row.verification_status != "pending":
        raise StaleLease(f"call {tool_call_id} is {row.verification_status}, not awaiting reconciliation")
    if row.lease_expires_at is not None and row.lease_expires_at >= now:
        raise StaleLease(f"call {tool_call_id} is being reconciled by {row.lease_owner}")
    payload = ev.ReconciliationStarted(
        method=method, attempt=row.reconcile_attempts + 1, **grant(owner, row.lease_token, now, lease_s)
    )
    log.add(ev.ReconciliationStartedEvent(**call_envelope(row, now, producer), payload=payload))
    log.flush()
    return log.call(tool_call_id)


def inconclusive(
    conn: Connection,
    tool_call_id: str,
    *,
    token: int,
    evidence: Mapping[str, Any],
    next_attempt_at: datetime,
    now: datetime,
    producer: str,
) -> CallView:
    """Record a lookup that could not tell, and when to try again; the lease ends.

    Raises:
        NotFound, StaleLease.
    """
    log = Append(conn)
    row = fenced(conn, tool_call_id, token, "result_unknown")
    payload = ev.ReconciliationInconclusive(
        attempt=row.reconcile_attempts, evidence=dict(evidence), next_attempt_at=ev.format_ts(next_attempt_at)
    )
    log.add(ev.ReconciliationInconclusiveEvent(**call_envelope(row, now, producer), payload=payload))
    log.flush()
    return log.call(tool_call_id)


def resolve(
    conn: Connection,
    tool_call_id: str,
    *,
    token: int,
    verdict: Verdict,
    result: Mapping[str, Any] | None,
    evidence: Mapping[str, Any],
    detail: str | None,
    now: datetime,
    producer: str,
) -> CallView:
    """Record the backend's answer: the call becomes `completed` or `failed`, verification confirmed.

    Raises:
        NotFound, StaleLease.
    """
    log = Append(conn)
    row = fenced(conn, tool_call_id, token, "result_unknown")
    payload = ev.ReconciliationResolved(
        verdict=verdict,
        result=dict(result) if result is not None else None,
        evidence=dict(evidence),
        detail=detail,
    )
    log.add(ev.ReconciliationResolvedEvent(**call_envelope(row, now, producer), payload=payload))
    log.flush()
    return log.call(tool_call_id)


def escalate(
    conn: Connection,
    tool_call_id: str,
    *,
    token: int,
    reason: str,
    detail: str | None,
    evidence: Mapping[str, Any],
    now: datetime,
    producer: str,
) -> CallView:
    """Hand the call to a human: it stays `result_unknown`, verification `inconclusive`.

    Raises:
        NotFound, StaleLease.
    """
    log = Append(conn)
    row = fenced(conn, tool_call_id, token, "result_unknown")
    payload = ev.ReconciliationEscalated(
        reason=reason, detail=detail, attempts=row.reconcile_attempts, evidence=dict(evidence)
    )
    log.add(ev.ReconciliationEscalatedEvent(**call_envelope(row, now, producer), payload=payload))
    log.flush()
    return log.call(tool_call_id)


def redispatch(
    conn: Connection,
    tool_call_id: str,
    *,
    token: int,
    owner: str,
    lease_s: float,
    now: datetime,
    producer: str,
) -> CallView:
    """Re-send with the same key (only for backends that deduplicate on it): a new attempt and lease.

    Raises:
        NotFound, StaleLease.
    """
    log = Append(conn)
    row = fenced(conn, tool_call_id, token, "result_unknown")
    payload = ev.ToolCallDispatching(
        attempt=row.attempts + 1,
        idempotency_key=row.idempotency_key,
        external_request_id=row.external_request_id,
        retry_of_attempt=row.attempts,
        **grant(owner, row.lease_token, now, lease_s),
    )
    log.add(ev.ToolCallDispatchingEvent(**call_envelope(row, now, producer), payload=payload))
    log.flush()
    return log.call(tool_call_id)


SETTLED_EVENTS = ("tool_call.completed", "tool_call.failed", "reconciliation.resolved")


def contradict(
    conn: Connection,
    tool_call_id: str,
    *,
    source: Literal["lookup", "late_response", "resolution"],
    verdict: Verdict,
    evidence: Mapping[str, Any],
    detail: str | None,
    now: datetime,
    producer: str,
    by: str | None = None,
) -> CallView | None:
    """Record evidence that disagrees with the call's settled verdict, with the settled verdict's own
    evidence beside it; the call keeps its status and waits for a person. None (nothing recorded) when
    the call is not settled or the evidence agrees.

    Raises:
        NotFound: no such call.
    """
    log = Append(conn)
    row = call_row(conn, tool_call_id)
    agrees = "completed" if verdict == "confirmed_success" else "failed"
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
        source=source,
        settled_status=row.status,
        settled_verification=row.verification_status,
        settled_event_id=settled.event_id if settled is not None else None,
        settled_evidence=_evidence_of(settled_payload),
        verdict=verdict,
        evidence=dict(evidence),
        detail=detail,
        by=by,
    )
    log.add(ev.ReconciliationContradictedEvent(**call_envelope(row, now, producer), payload=payload))
    log.flush()
    return log.call(tool_call_id)


def _evidence_of(payload: Mapping[str, Any]) -> dict[str, Any]:
    evidence = dict(payload.get("evidence") or {})
    for name in ("error", "detail", "resolved_by"):
        if payload.get(name) is not None:
            evidence.setdefault(name, payload[name])
    return evidence


def resolve_by_human(
    conn: Connection,
    tool_call_id: str,
    *,
    succeeded: bool,
    evidence: str,
    by: str,
    now: datetime,
    producer: str,
    tenant: str | None,
) -> CallView:
    """A person settles an unknown or contradicted call with their evidence, or contradicts a settled
    one; recorded with who.

    Raises:
        NotFound: no such call (in `tenant`, when given).
        StaleLease: the call is settled and the person agrees with it (nothing to record).
    """
    log = Append(conn)
    row = call_row(conn, tool_call_id)
    if tenant is not None and row.tenant != tenant:
        raise NotFound(f"no tool call {tool_call_id}")
    if not evidence.strip() or not by.strip():
        raise StoreError("a manual resolution needs evidence and the name of who resolved it")
    verdict: Verdict = "confirmed_success" if succeeded else "confirmed_failure"
    contradicted = row.status in ("completed", "failed") and row.verification_status == "inconclusive"
    if row.status != "result_unknown" and not contradicted:
        # A person disagreeing with a settled verdict is a contradiction: recorded and escalated
        # beside the verdict, which is not overwritten. Agreeing with it changes nothing.
        call = contradict(
            conn,
            tool_call_id,
            source="resolution",
            verdict=verdict,
            evidence={"manual": evidence},
            detail=f"contradicted by {by}",
            by=by,
            now=now,
            producer=producer,
        )
        if call is None:
            raise StaleLease(
                f"call {tool_call_id} is {row.status}: nothing unknown to settle, nothing to contradict"
            )
        return call
    payload = ev.ReconciliationResolved(
        verdict=verdict,
        evidence={"manual": evidence},
        detail=f"resolved by {by}",
        resolved_by=by,
    )
    log.add(ev.ReconciliationResolvedEvent(**call_envelope(row, now, producer), payload=payload))
    log.flush()
    return log.call(tool_call_id)
