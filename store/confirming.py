"""The confirmation leg of a call: the user's answer in the client, consumed once, or its expiry.

A call of a `confirm` capability is admitted as `awaiting_confirmation`. The answer is a compare-and-set
under the log-head lock: only a call still awaiting this confirmation, for this exact action, before
its expiry, moves on (accept: `confirmation.given` + `tool_call.dispatching` with a lease, so the
answering process owns the dispatch; decline or cancel: `confirmation.declined`, the call is denied).
A second answer, a replayed one, or one for another action is refused and records nothing.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, select

from store import events as ev
from store.leasing import call_envelope, call_row, grant, overdue_calls
from store.log import Append
from store.model import Answer, CallView, ConfirmationMismatch, StaleLease
from store.schema import tool_calls
from store.views import call_view, first_sent_key_of


def answer(
    conn: Connection,
    tool_call_id: str,
    *,
    confirmation_id: str,
    action_hash: str,
    action: Answer,
    answered_by: str,
    now: datetime,
    producer: str,
    lease_owner: str,
    lease_s: float,
) -> CallView:
    """Record the user's answer to a pending confirmation; on accept the caller now owns the dispatch.

    Raises:
        NotFound: no such call.
        StaleLease: the call is not awaiting confirmation (already answered, expired) or is past expiry.
        ConfirmationMismatch: another confirmation id or action hash than the call's.
    """
    log = Append(conn)
    row = call_row(conn, tool_call_id)
    if row.status != "awaiting_confirmation":
        raise StaleLease(f"call {tool_call_id} is {row.status}: its confirmation is already used")
    if row.confirmation_id != confirmation_id or row.action_hash != action_hash:
        raise ConfirmationMismatch(f"the answer is not bound to call {tool_call_id}'s pending action")
    if now >= row.confirmation_expires_at:
        raise StaleLease(f"the confirmation of call {tool_call_id} expired")
    envelope = call_envelope(row, now, producer)
    payload = ev.ConfirmationAnswered(confirmation_id=confirmation_id, answered_by=answered_by, action=action)
    if action != "accept":
        log.add(ev.ConfirmationDeclinedEvent(**envelope, payload=payload))
        log.flush()
        return log.call(tool_call_id)
    given = log.add(ev.ConfirmationGivenEvent(**envelope, payload=payload))
    dispatching = ev.ToolCallDispatching(
        attempt=row.attempts + 1,
        idempotency_key=first_sent_key_of(conn, row.tenant, row.subject, row.idempotency_key, tool_call_id),
        external_request_id=row.external_request_id,
        **grant(lease_owner, row.lease_token, now, lease_s),
    )
    envelope["causation_id"] = given.event_id
    log.add(ev.ToolCallDispatchingEvent(**envelope, payload=dispatching))
    log.flush()
    return log.call(tool_call_id)


def expired_confirmation(now: Any) -> tuple[Any, ...]:
    """Calls still awaiting confirmation past its expiry at `now` (a datetime, or a bound parameter)."""
    return (tool_calls.c.status == "awaiting_confirmation", tool_calls.c.confirmation_expires_at <= now)


def any_due(conn: Connection, *, now: datetime) -> bool:
    """Whether some confirmation is past its expiry: a look that takes no lock."""
    query = select(tool_calls.c.tool_call_id).where(*expired_confirmation(now)).exists()
    return conn.execute(select(query)).scalar_one()


def expire_due(conn: Connection, *, now: datetime, producer: str, limit: int) -> list[CallView]:
    """Expire every call still awaiting confirmation past its expiry; they will never run."""
    log = Append(conn)
    rows = overdue_calls(conn, expired_confirmation(now), tool_calls.c.confirmation_expires_at, limit)
    for row in rows:
        payload = ev.ConfirmationExpired(confirmation_id=row.confirmation_id)
        log.add(ev.ConfirmationExpiredEvent(**call_envelope(row, now, producer), payload=payload))
    log.flush()
    ids = [row.tool_call_id for row in rows]
    if not ids:
        return []
    return [call_view(r) for r in conn.execute(select(tool_calls).where(tool_calls.c.tool_call_id.in_(ids)))]
