"""Leases with fencing tokens: who may record for a call right now, and recovery of expired dispatches.

A lease is granted with an event (`tool_call.dispatching`, `reconciliation.started`) that carries the
owner, its expiry and a fencing token one higher than the call's last. Every later recording for that
lease presents the token; the check runs under the log-head lock, in the transaction that appends, so
it is a compare-and-set that holds across replicas. A worker that paused past its lease finds either a
newer token or a settled call and is refused with `StaleLease`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Row, bindparam, select

from store import events as ev
from store.log import Append
from store.model import CallView, NotFound, StaleLease
from store.raw import Record, Statement
from store.schema import read_correlation, tool_calls
from store.views import CALL_BY_ID, call_view

# What the fencing check and a new event's envelope read of the call (`call_envelope`), for writers that
# need no more of it: a third of the row's columns, each of which PostgreSQL's client describes per result.
# Both reads run on the raw cursor (store.raw).
_c = tool_calls.c
_CALL_BY_ID = Statement(CALL_BY_ID)
ENVELOPE_BY_ID = Statement(
    select(
        _c.tool_call_id,
        _c.run_id,
        _c.approval_id,
        _c.capability_id,
        _c.capability_version,
        _c.policy_version,
        _c.correlation_id,
        _c.last_event_id,
        _c.tenant,
        _c.status,
        _c.lease_token,
    ).where(_c.tool_call_id == bindparam("b_tool_call_id"))
)


def call_envelope(row: Record, now: datetime, producer: str) -> dict[str, Any]:
    """The envelope fields of a new event about the call in `row`, caused by its last event."""
    return {
        "occurred_at": ev.format_ts(now),
        "producer": producer,
        "run_id": row.run_id,
        "tool_call_id": row.tool_call_id,
        "approval_id": row.approval_id,
        "capability_id": row.capability_id,
        "capability_version": row.capability_version,
        "policy_version": row.policy_version,
        "correlation_id": read_correlation(row.correlation_id, row.tool_call_id),
        "causation_id": row.last_event_id,
        "tenant": row.tenant,
    }


def grant(owner: str, previous_token: int, now: datetime, lease_s: float) -> dict[str, Any]:
    """The lease fields of a granting event's payload: the next fencing token and the expiry."""
    return {
        "lease_owner": owner,
        "fencing_token": previous_token + 1,
        "lease_expires_at": ev.format_ts(now + timedelta(seconds=lease_s)),
    }


def call_row(conn: Connection, tool_call_id: str, read: Statement = _CALL_BY_ID) -> Record:
    """The call's row as `read` selects it by `b_tool_call_id`. Raises: NotFound."""
    row = read.one_or_none(conn, {"b_tool_call_id": tool_call_id})
    if row is None:
        raise NotFound(f"no tool call {tool_call_id}")
    return row


def fenced(
    conn: Connection, tool_call_id: str, token: int, status: str, read: Statement = _CALL_BY_ID
) -> Record:
    """The call's row as `read` selects it, if it is in `status` and `token` is its current fencing token.

    An expired lease that nobody has taken over is still honoured: the holder's facts are the best
    there are. Recovery takes it over by settling the call, which moves the status on.

    Raises:
        NotFound: no such call.
        StaleLease: the call moved on, or a newer lease was granted.
    """
    row = call_row(conn, tool_call_id, read)
    if row.status != status:
        raise StaleLease(
            f"call {tool_call_id} is {row.status}, not {status}: its outcome is already recorded "
            "or it was never dispatched"
        )
    if row.lease_token != token:
        raise StaleLease(f"call {tool_call_id} is fenced at token {row.lease_token}, not {token}")
    return row


def expired_dispatch(now: Any) -> tuple[Any, ...]:
    """Calls left `dispatching` past their lease at `now` (a datetime, or a bound parameter)."""
    return (tool_calls.c.status == "dispatching", tool_calls.c.lease_expires_at < now)


def overdue_calls(conn: Connection, where: tuple[Any, ...], due: Any, limit: int) -> Sequence[Row[Any]]:
    """Up to `limit` calls matching `where`, longest overdue first by `due`, locked; rows another
    transaction holds are skipped, so replicas settling at once never wait on each other."""
    return conn.execute(
        select(tool_calls).where(*where).order_by(due).limit(limit).with_for_update(skip_locked=True)
    ).all()


def any_expired(conn: Connection, *, now: datetime) -> bool:
    """Whether some call is left dispatching past its lease: a look that takes no lock."""
    return conn.execute(
        select(select(tool_calls.c.tool_call_id).where(*expired_dispatch(now)).exists())
    ).scalar_one()


def recover_expired(conn: Connection, *, now: datetime, producer: str, limit: int) -> list[CallView]:
    """Declare `result_unknown` every call left `dispatching` past its lease (never re-dispatch it).

    The dispatcher may or may not have reached the backend before it stopped; only reconciliation can
    tell, so the evidence records what is known: who held the lease, which token, since when.
    """
    log = Append(conn)
    # Under the head lock every candidate is re-read at its latest committed state. SKIP LOCKED lets
    # a replica pass over rows another transaction is settling right now (PostgreSQL; SQLite has one
    # writer at a time anyway).
    rows = overdue_calls(conn, expired_dispatch(now), tool_calls.c.lease_expires_at, limit)
    for row in rows:
        evidence = {
            "recovered_by": producer,
            "lease_owner": row.lease_owner,
            "fencing_token": row.lease_token,
            "lease_expired_at": ev.format_ts(row.lease_expires_at),
            "attempt": row.attempts,
            "known": "tool_call.dispatching was recorded; no outcome was recorded before the lease expired",
        }
        unknown = ev.ToolCallResultUnknown(
            error="lease_expired",
            detail=f"dispatcher {row.lease_owner} recorded no outcome before its lease expired",
            evidence=evidence,
        )
        log.add(ev.ToolCallResultUnknownEvent(**call_envelope(row, now, producer), payload=unknown))
    log.flush()
    return [call_view(r) for r in _reload(conn, [r.tool_call_id for r in rows])]


def _reload(conn: Connection, ids: list[str]) -> list[Row[Any]]:
    if not ids:
        return []
    return list(conn.execute(select(tool_calls).where(tool_calls.c.tool_call_id.in_(ids))).all())
