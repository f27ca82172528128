"""The approval leg of a call: decide, expire, then dispatch or refuse the approved call."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Row, bindparam, select

from store import events as ev
from store import queues
from store.commands import DecideApproval, ExpireApproval
from store.leasing import call_envelope, grant
from store.log import Append
from store.model import ApprovalView, CallView, Charge, LoopKey, NotFound, StaleLease, StoreError
from store.recording import breach_detail, breach_of, charged, detected, exceeded, hold_counts
from store.schema import approvals, events, tool_calls
from store.views import approval_view, first_sent_key_of, load_approval

if TYPE_CHECKING:  # the write commands, named only in signatures
    from store.model import ApprovedDenial, ApprovedDispatch


def decide(conn: Connection, cmd: DecideApproval, *, producer: str) -> ApprovalView:
    """Grant or reject an approval that is still awaiting a decision and not yet past its expiry.

    Raises:
        NotFound: no such approval (for this tenant).
        StaleLease: the approval was already decided or has expired.
        StoreError: the requester, or the person who asked for this retry of a failed call, tried to
            approve it where the policy does not let a requester approve.
    """
    log = Append(conn)
    approval_id, decided_by = cmd.approval_id, cmd.decided_by
    approval, call_row = _awaiting(conn, approval_id, cmd.tenant)
    if cmd.now >= approval.expires_at:
        raise StaleLease(f"approval {approval_id} expired at {ev.format_ts(approval.expires_at)}")
    if cmd.approve and not approval.requester_may_approve:
        if decided_by == approval.requester:
            raise StoreError(f"{decided_by} requested call {approval.tool_call_id} and may not approve it")
        if decided_by == retry_requested_by(conn, approval.tool_call_id):
            raise StoreError(f"{decided_by} asked for retry {approval.tool_call_id} and may not approve it")
    roles = sorted(cmd.decided_by_roles) if cmd.decided_by_roles is not None else None
    payload = ev.ApprovalDecided(
        decided_by=decided_by, reason=cmd.reason, break_glass=cmd.break_glass, decided_by_roles=roles
    )
    envelope = call_envelope(call_row, cmd.now, producer)
    log.add(
        ev.ApprovalGrantedEvent(**envelope, payload=payload)
        if cmd.approve
        else ev.ApprovalRejectedEvent(**envelope, payload=payload)
    )
    if not cmd.approve:
        queues.release(conn, approval_id)
    log.flush()
    return _reload_approval(conn, approval_id)


_REQUESTED = select(events.c.payload).where(
    events.c.tool_call_id == bindparam("b_call"), events.c.type == "tool_call.requested"
)
_RETRIES_ASKED = select(events.c.payload).where(
    events.c.tool_call_id == bindparam("b_call"), events.c.type == "tool_call.retry_requested"
)


def retry_requested_by(conn: Connection, tool_call_id: str) -> str | None:
    """Who asked for `tool_call_id` as a retry of a failed call, as the original's
    `tool_call.retry_requested` names them; None for a call nobody asked to re-run.

    They stand to the retry as its requester does: resolving a call `failed` and retrying it is one
    person's to do, approving that retry is someone else's (README, separation of duties).
    """
    text = conn.execute(_REQUESTED, {"b_call": tool_call_id}).scalar_one_or_none()
    retry_of = json.loads(text).get("retry_of") if text is not None else None
    if retry_of is None:
        return None
    for asked in conn.execute(_RETRIES_ASKED, {"b_call": retry_of}).scalars():
        payload = json.loads(asked)
        if payload.get("retry_tool_call_id") == tool_call_id:
            return str(payload["requested_by"])
    return None


def expire(conn: Connection, cmd: ExpireApproval, *, producer: str) -> ApprovalView:
    """Expire an approval still awaiting a decision once its expiry has passed.

    Raises:
        NotFound: no such approval.
        StaleLease: the approval was decided meanwhile, or is not yet due to expire.
    """
    log = Append(conn)
    approval_id, now = cmd.approval_id, cmd.now
    approval, call_row = _awaiting(conn, approval_id, None)
    if now < approval.expires_at:
        raise StaleLease(f"approval {approval_id} does not expire until {ev.format_ts(approval.expires_at)}")
    log.add(ev.ApprovalExpiredEvent(**call_envelope(call_row, now, producer), payload=ev.ApprovalExpired()))
    queues.release(conn, approval_id)
    log.flush()
    return _reload_approval(conn, approval_id)


def dispatch(conn: Connection, req: ApprovedDispatch, *, producer: str) -> CallView:
    """Move an approved call to `dispatching`; the caller now owns the dispatch.

    `policy_version` names the policy that re-authorized the call at execution time.

    Raises:
        NotFound: no such call.
        StaleLease: the call is not `approved` (another worker dispatched it, or it was refused).
    """
    log = Append(conn)
    row = _approved(conn, req.tool_call_id)
    envelope = call_envelope(row, req.now, producer)
    if req.policy_version is not None:
        envelope["policy_version"] = req.policy_version
    # Budgets and loops again, at execution, under the head lock as at admission: counters the call was
    # charged on then hold it already; any other (a new window, a budget added) must still fit.
    fresh = _uncharged(conn, row, req.charges)
    if (refused := _guarded_again(conn, log, row, envelope, fresh, req.loops)) is not None:
        return refused
    payload = ev.ToolCallDispatching(
        attempt=row.attempts + 1,
        idempotency_key=first_sent_key_of(
            conn, row.tenant, row.subject, row.idempotency_key, req.tool_call_id
        ),
        external_request_id=row.external_request_id,
        **grant(req.lease_owner, row.lease_token, req.now, req.lease_s),
        charges=[charged(c) for c in fresh] or None,
    )
    log.add(ev.ToolCallDispatchingEvent(**envelope, payload=payload))
    log.flush()
    return log.call(req.tool_call_id)


def deny(conn: Connection, req: ApprovedDenial, *, producer: str) -> CallView:
    """Refuse an approved call whose re-authorization at execution time failed.

    `policy_version` (the policy in force at execution) replaces the request's in the event.

    Raises:
        NotFound: no such call.
        StaleLease: the call is not `approved`.
    """
    log = Append(conn)
    row = _approved(conn, req.tool_call_id)
    payload = ev.ToolCallDenied(reason=req.reason, rule_id=req.rule_id, detail=req.detail)
    envelope = call_envelope(row, req.now, producer)
    if req.policy_version is not None:
        envelope["policy_version"] = req.policy_version
    log.add(ev.ToolCallDeniedEvent(**envelope, payload=payload))
    queues.release(conn, row.approval_id)
    log.flush()
    return log.call(req.tool_call_id)


def _awaiting(conn: Connection, approval_id: str, tenant: str | None) -> tuple[ApprovalView, Row[Any]]:
    approval = load_approval(conn, approval_id, tenant)
    if approval is None:
        raise NotFound(f"no approval {approval_id}")
    if approval.status != "awaiting_approval":
        raise StaleLease(f"approval {approval_id} is already {approval.status}")
    call_row = conn.execute(
        select(tool_calls).where(tool_calls.c.tool_call_id == approval.tool_call_id)
    ).one()
    return approval, call_row


def _approved(conn: Connection, tool_call_id: str) -> Row[Any]:
    row = conn.execute(select(tool_calls).where(tool_calls.c.tool_call_id == tool_call_id)).one_or_none()
    if row is None:
        raise NotFound(f"no tool call {tool_call_id}")
    if row.status != "approved":
        raise StaleLease(f"call {tool_call_id} is {row.status}, not approved")
    return row


def _reload_approval(conn: Connection, approval_id: str) -> ApprovalView:
    row = conn.execute(select(approvals).where(approvals.c.approval_id == approval_id)).one()
    return approval_view(row)


def _uncharged(conn: Connection, row: Row[Any], charges: tuple[Charge, ...]) -> tuple[Charge, ...]:
    """`charges` the call did not draw on when it was admitted (read from its `tool_call.requested`)."""
    if not charges:
        return ()
    text = conn.execute(
        select(events.c.payload).where(
            events.c.tool_call_id == row.tool_call_id, events.c.type == "tool_call.requested"
        )
    ).scalar_one_or_none()
    done = {c.get("key") for c in (json.loads(text).get("charges") or ())} if text else set()
    return tuple(c for c in charges if c.counter_key not in done)


def _guarded_again(
    conn: Connection,
    log: Append,
    row: Row[Any],
    envelope: dict[str, Any],
    fresh: tuple[Charge, ...],
    loops: tuple[LoopKey, ...],
) -> CallView | None:
    """The call denied (`loop_detected`, `budget_exceeded`) if a loop was found in one of its patterns
    since it was admitted, or a counter it was not charged on has no room; else None."""
    hold_counts(conn, row.tenant, counted=bool(fresh or loops))
    found = detected(conn, loops)
    if found is not None:
        detail = f"loop rule {found!r} found this call's pattern looping while it waited for approval"
        denial = ev.ToolCallDenied(reason="loop_detected", rule_id=found, detail=detail)
        log.add(ev.ToolCallDeniedEvent(**envelope, payload=denial))
    elif (breach := breach_of(conn, fresh)) is not None:
        detail = breach_detail(breach)
        log.add(ev.BudgetExceededEvent(**envelope, payload=exceeded(breach, detail)))
        denial = ev.ToolCallDenied(reason="budget_exceeded", detail=detail)
        log.add(ev.ToolCallDeniedEvent(**envelope, payload=denial))
    else:
        return None
    queues.release(conn, row.approval_id)
    log.flush()
    return log.call(row.tool_call_id)
