"""What each write records: the events of admitting, refusing and settling a call, inside one transaction."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any

from sqlalchemy import Connection, bindparam, or_, select

from store import events as ev
from store import queues
from store.commands import RecordOutcome, StopRun
from store.leasing import ENVELOPE_BY_ID, call_envelope, fenced, grant
from store.log import Append, lock_head
from store.model import (
    IN_FLIGHT_STATUSES,
    Admission,
    Breach,
    CallIdentity,
    CallRequest,
    CallView,
    Charge,
    DecisionRecord,
    LoopHit,
    LoopKey,
    OutcomeRecord,
    ReadRecord,
    RefusalRequest,
    RetryRefused,
    StoreError,
)
from store.partitions import scheme_of
from store.raw import Statement
from store.refusals import bounded
from store.running import RUN_STOPPED, WRIT, halt
from store.schema import budget_counters, effect_ledger, events, loop_marks, revocations, runs, tool_calls
from store.views import first_sent_key, load_call


def _ledger(column: Any) -> Any:
    return (
        select(column)
        .where(
            effect_ledger.c.tenant == bindparam("b_tenant"),
            effect_ledger.c.subject == bindparam("b_subject"),
            effect_ledger.c.idempotency_key == bindparam("b_idempotency_key"),
        )
        .scalar_subquery()
    )


# What admit needs to know before it records anything, in one round trip. Built once, not per call,
# and run on the raw cursor (store.raw).
_ADMIT_LOOKUP = Statement(
    select(
        select(runs.c.tenant)
        .where(runs.c.run_id == bindparam("b_run_id"))
        .scalar_subquery()
        .label("run_tenant"),
        select(runs.c.status)
        .where(runs.c.run_id == bindparam("b_run_id"))
        .scalar_subquery()
        .label("run_status"),
        _ledger(effect_ledger.c.tool_call_id).label("holder"),
        _ledger(effect_ledger.c.action_hash).label("holder_hash"),
        select(revocations.c.subject)
        .where(revocations.c.tenant == bindparam("b_tenant"), revocations.c.subject == bindparam("b_subject"))
        .exists()
        .label("revoked"),
    )
)
_RUN_TENANT = Statement(select(runs.c.tenant).where(runs.c.run_id == bindparam("b_run_id")))


def _stopped(req: CallRequest, lookup: Any) -> RefusalRequest | None:
    """The refusal of a call in a stopped run (read under the head lock, so every replica agrees)."""
    if lookup.run_status != "stopped":
        return None
    who = req.identity
    detail = (
        f"run {who.run_id} was stopped by a person; no call of it runs until it is resumed. Stop and "
        "report to your user instead of retrying"
    )
    return _refusal_of(req, RUN_STOPPED, detail)


def admit(conn: Connection, req: CallRequest, *, producer: str) -> Admission:
    """Record a call's intent and decision, claiming its idempotency key unless another call holds it."""
    log = Append(conn)
    who = req.identity
    # After the head lock, so under PostgreSQL's read committed this statement sees every earlier claim.
    lookup = _ADMIT_LOOKUP.one(conn, _lookup_params(who))
    _check_run_tenant(who.run_id, lookup.run_tenant, who.tenant)
    _note_retry(conn, log, who, req.policy_version, producer)
    if lookup.revoked:
        # Standing is checked in the same transaction as the claim: a revoked subject causes nothing.
        refusal = _refusal_of(req, "principal_revoked", f"{who.subject} is revoked in tenant {who.tenant}")
        return Admission("new", call=_record_refusal(conn, log, refusal, lookup.run_tenant, producer))
    if (stopped := _stopped(req, lookup)) is not None:
        return Admission("new", call=_record_refusal(conn, log, stopped, lookup.run_tenant, producer))
    superseded: CallView | None = None
    if lookup.holder is not None:
        existing = load_call(conn, lookup.holder)
        if existing is None:
            raise StoreError(f"effect ledger names call {lookup.holder}, which has no projection row")
        if lookup.holder_hash != who.action_hash:
            call = _record_conflict(
                conn, log, req, existing, run_is_new=lookup.run_tenant is None, producer=producer
            )
            return Admission("conflict", call=call, existing=existing)
        if who.retry is not None and who.retry.of == existing.tool_call_id:
            if not who.retry.same_key:  # only a backend that deduplicates may see the key again
                raise StoreError(f"retry {who.tool_call_id} is not to reuse key {who.idempotency_key!r}")
        elif who.key_source == "client" or _joinable(existing, req):
            log.flush()  # a retry's request is recorded even when it joins a call holding its key
            return Admission("joined", call=existing)
        superseded = existing
    # Still under the head lock, so every earlier charge and loop mark of every replica is visible and
    # no later one can land between this read and the charge: no extra commit.
    hold_counts(conn, who.tenant, counted=bool(req.charges or req.loops))
    loop = _loop(conn, req.loops)
    if loop is not None:
        call, loop = _record_loop(conn, log, req, loop, lookup.run_tenant, producer)
        return Admission("new", call=call, loop=loop)
    over = _breaching(conn, req.charges)
    passed: Breach | None = None
    if over:
        if req.over_budget is None or any(charge.approval is None for charge, _ in over):
            call = _record_breach(conn, log, req, over[0][1], lookup.run_tenant, producer)
            return Admission("new", call=call, breach=over[0][1])
        # Every budget it passes says require_approval: a person decides; it is charged past the limit.
        req, passed = replace(req, decision=req.over_budget), over[0][1]
    _record_new(
        log,
        req,
        supersedes=superseded.tool_call_id if superseded is not None else None,
        sent_key=first_sent_key(who.tenant, who.subject, who.idempotency_key, superseded),
        run_is_new=lookup.run_tenant is None,
        producer=producer,
        passed=passed,
    )
    queues.on_admitted(conn, req)
    log.flush()
    return Admission("new", call=log.call(who.tool_call_id))


def admissible_read(conn: Connection, req: CallRequest) -> bool:
    """Whether a read allowed by policy may run before anything is recorded (`record_read` after it).

    False when its principal is revoked, its run stopped, it belongs to a loop or a budget it draws on
    would pass its limit: then the call is admitted as any other (`admit`), which records the refusal
    and asks no backend. A plain read, without the head lock and with no commit: `record_read` checks
    it all again, and charges, in its one transaction.
    """
    who = req.identity
    lookup = _ADMIT_LOOKUP.one(conn, _lookup_params(who))
    _check_run_tenant(who.run_id, lookup.run_tenant, who.tenant)
    return (
        not lookup.revoked
        and lookup.run_status != "stopped"
        and _loop(conn, req.loops) is None
        and breach_of(conn, req.charges) is None
    )


def record_read(conn: Connection, rec: ReadRecord, *, producer: str) -> Admission:
    """Record a read that already ran in one transaction: requested, dispatching and its outcome.

    Its budgets are charged and its loop patterns marked here, under the head lock, where standing,
    the run, loops and budgets are checked again as `admit` checks them: a read whose principal was
    revoked, whose run was stopped, whose pattern reached its threshold or whose budget ran out since
    `admissible_read` is recorded refused (`principal_revoked`, `run_stopped`, `loop_detected`,
    `budget_exceeded`, its detail saying the backend was asked) and what the backend answered is not
    recorded, so nobody is told it. Its key is taken over from any call holding it: a derived key only
    joins identical calls, and a read has no effect for a second holder to duplicate.
    """
    req = rec.request
    log = Append(conn)
    who = req.identity
    lookup = _ADMIT_LOOKUP.one(conn, _lookup_params(who))
    _check_run_tenant(who.run_id, lookup.run_tenant, who.tenant)
    if lookup.revoked:
        why = f"{who.subject} is revoked in tenant {who.tenant}{_WITHHELD}"
        refusal = _refusal_of(req, "principal_revoked", why)
        return Admission("new", call=_record_refusal(conn, log, refusal, lookup.run_tenant, producer))
    if (stopped := _stopped(req, lookup)) is not None:
        stopped = replace(stopped, detail=f"{stopped.detail}{_WITHHELD}")
        return Admission("new", call=_record_refusal(conn, log, stopped, lookup.run_tenant, producer))
    hold_counts(conn, who.tenant, counted=bool(req.charges or req.loops))
    loop = _loop(conn, req.loops)
    if loop is not None:
        call, loop = _record_loop(conn, log, req, loop, lookup.run_tenant, producer, ran=True)
        return Admission("new", call=call, loop=loop)
    breach = breach_of(conn, req.charges)
    if breach is not None:
        call = _record_breach(conn, log, req, breach, lookup.run_tenant, producer, ran=True)
        return Admission("new", call=call, breach=breach)
    last = _record_new(
        log, req, supersedes=lookup.holder, run_is_new=lookup.run_tenant is None, producer=producer
    )
    envelope = {
        **_base(who, req.policy_version, producer),
        "occurred_at": ev.format_ts(rec.observed_at),
        "tool_call_id": who.tool_call_id,
        "causation_id": last.event_id,
    }
    log.add(outcome_event(envelope, rec.outcome))
    log.flush()
    return Admission("new", call=log.call(who.tool_call_id))


_WITHHELD = (
    " (found when its answer was recorded: the read had reached the backend, which it changes nothing "
    "in, and its answer is withheld)"
)
"""What the refusal of a read that lost a race at its commit adds: the log says the backend was asked."""


def _lookup_params(who: CallIdentity) -> dict[str, Any]:
    return {
        "b_run_id": who.run_id,
        "b_tenant": who.tenant,
        "b_idempotency_key": who.idempotency_key,
        "b_subject": who.subject,
    }


def _loop(conn: Connection, loops: tuple[LoopKey, ...]) -> LoopHit | None:
    """The first loop pattern of the call whose window already holds its threshold of calls (for
    `repeated_failure`: of calls failed with one error), or None."""
    if not loops:
        return None
    rows = conn.execute(
        select(
            loop_marks.c.pattern_key,
            loop_marks.c.tool_call_id,
            loop_marks.c.kind,
            tool_calls.c.status,
            tool_calls.c.error,
        )
        .select_from(loop_marks.outerjoin(tool_calls, tool_calls.c.tool_call_id == loop_marks.c.tool_call_id))
        .where(loop_marks.c.pattern_key.in_([k.pattern for k in loops]))
        # A failure rule marks every call of its capability, but only the failed ones count: the
        # others (most of them) stay in the database instead of being read on every call.
        .where(
            or_(
                loop_marks.c.kind == "detected",
                loop_marks.c.pattern_key.in_([k.pattern for k in loops if k.kind != "repeated_failure"]),
                tool_calls.c.status == "failed",
            )
        )
        .order_by(loop_marks.c.seq)
    ).all()
    for key in loops:
        mine = [row for row in rows if row.pattern_key == key.pattern]
        detected = any(row.kind == "detected" for row in mine)
        calls = [row for row in mine if row.kind == "call"]
        error: str | None = None
        if key.kind == "repeated_failure":
            by_error: dict[str, list[str]] = {}
            for row in calls:
                if row.status == "failed":
                    by_error.setdefault(row.error or "", []).append(row.tool_call_id)
            error, ids = max(by_error.items(), key=lambda item: len(item[1]), default=(None, []))
            evidence = tuple(ids)
        else:
            evidence = tuple(row.tool_call_id for row in calls)
        if detected or len(evidence) >= key.threshold:
            return LoopHit(
                key.rule_id,
                key.kind,
                key.pattern,
                key.threshold,
                key.window_s,
                key.resets_at,
                evidence,
                first=not detected,
                error=error,
                action=key.action,
            )
    return None


def _record_loop(
    conn: Connection,
    log: Append,
    req: CallRequest,
    loop: LoopHit,
    run_tenant: str | None,
    producer: str,
    *,
    ran: bool = False,
) -> tuple[CallView, LoopHit]:
    """Record a call refused `loop_detected`: requested (counted nowhere), loop.detected the first
    time its pattern is refused in the window, denied; and, for a rule that pauses runs, its run
    stopped by Writ (`run.stopped`, caused by the refusal). Returns the call and the loop as found."""

    def detected(call: dict[str, Any], refusal: RefusalRequest) -> ev.Event | None:
        if not loop.first:
            return None
        found = ev.LoopDetected(
            action_hash=refusal.identity.action_hash,
            count=len(loop.tool_call_ids),
            rule=loop.rule_id,
            kind=loop.kind,
            threshold=loop.threshold,
            window_s=loop.window_s,
            key=loop.pattern,
            tool_call_ids=list(loop.tool_call_ids),
            resets_at=ev.format_ts(loop.resets_at),
            detail=refusal.detail,
            error=loop.error,
        )
        return ev.LoopDetectedEvent(**call, payload=found)

    who = req.identity
    pausing = loop.action == "pause_run" and who.run_id is not None
    detail = _loop_detail(loop) + (_paused_detail(who.run_id) if pausing else "") + (_WITHHELD if ran else "")
    call, denied = _record_guarded(log, req, "loop_detected", detail, detected, run_tenant, producer)
    if not pausing or who.run_id is None:
        return call, loop
    stop = StopRun(who.run_id, stopped_by=WRIT, reason=_pause_reason(who.tool_call_id, loop), now=who.now)
    halt(conn, log, stop, who.tenant, producer=producer, caused_by=denied.event_id)
    return call, replace(loop, paused_run=who.run_id)


def _paused_detail(run_id: str | None) -> str:
    return f"; Writ stopped run {run_id}: its calls are refused until a person resumes it"


PAUSE_EVIDENCE = 20
"""How many of the loop's calls a pause's reason names (`loop.detected` and the refusal hold them all)."""


def _pause_reason(tool_call_id: str, loop: LoopHit) -> str:
    ids = loop.tool_call_ids
    named = ", ".join(ids[:PAUSE_EVIDENCE]) + (
        f" and {len(ids) - PAUSE_EVIDENCE} more" if len(ids) > PAUSE_EVIDENCE else ""
    )
    what = (
        f"failed the same way ({loop.error})"
        if loop.kind == "repeated_failure"
        else f"repeated ({loop.kind})"
    )
    return (
        f"loop rule {loop.rule_id!r} (on_detect: pause_run): call {tool_call_id} was refused loop_detected, "
        f"its pattern {loop.pattern} {what} {len(ids)} times within {loop.window_s} s: calls {named}"
    )


def _loop_detail(loop: LoopHit) -> str:
    if loop.kind == "repeated_failure":
        return (
            f"loop rule {loop.rule_id!r}: this tool failed {len(loop.tool_call_ids)} times with the same "
            f"error ({loop.error}) within {loop.window_s} s; further calls are refused until "
            f"{ev.format_ts(loop.resets_at)}"
        )
    what = "the same call" if loop.kind == "repeated_action" else "nearly the same call"
    return (
        f"loop rule {loop.rule_id!r}: {what} was made {loop.threshold} times within {loop.window_s} s; "
        f"further ones are refused until {ev.format_ts(loop.resets_at)}"
    )


def hold_counts(conn: Connection, tenant: str, *, counted: bool) -> None:
    """Hold the head a tenant's budget counters and loop marks are checked and charged under.

    With one partition, or one per tenant, that is the head the call's own events take, held already.
    With buckets (`store.log.buckets`), a tenant's calls append under their run's bucket, but a budget
    or a loop pattern spans runs: a counted call also takes the tenant's runless bucket's head (the
    one its revocations go to), so counted calls of one tenant are checked and charged one at a time
    across replicas, while calls no rule counts still append in parallel. A head taken out of order
    restarts the transaction (`PartitionOrder`), never deadlocks.
    """
    scheme = scheme_of(conn.engine)
    if counted and scheme.buckets > 1:
        lock_head(conn, scheme.partition_for(tenant, None, None))


def breach_of(conn: Connection, charges: tuple[Charge, ...]) -> Breach | None:
    """The first charge that would take its counter past its limit, or None."""
    over = _breaching(conn, charges)
    return over[0][1] if over else None


def _breaching(conn: Connection, charges: tuple[Charge, ...]) -> list[tuple[Charge, Breach]]:
    """Each charge that would take its counter past its limit, in order, with its breach."""
    if not charges:
        return []
    keys = [c.counter_key for c in charges]
    rows = conn.execute(
        select(budget_counters.c.counter_key, budget_counters.c.used_micros).where(
            budget_counters.c.counter_key.in_(keys)
        )
    ).all()
    used = {row.counter_key: int(row.used_micros) for row in rows}
    over: list[tuple[Charge, Breach]] = []
    for charge in charges:
        so_far = used.get(charge.counter_key, 0)
        if so_far + charge.amount_micros > charge.limit_micros:
            breach = Breach(
                charge.budget_id,
                charge.limit_micros,
                so_far,
                charge.amount_micros,
                charge.resets_at,
                charge.scope,
                charge.counter_key,
            )
            over.append((charge, breach))
    return over


def _record_breach(
    conn: Connection,
    log: Append,
    req: CallRequest,
    breach: Breach,
    run_tenant: str | None,
    producer: str,
    *,
    ran: bool = False,
) -> CallView:
    """Record a call refused `budget_exceeded`: requested (charging nothing), budget.exceeded, denied."""

    def finding(call: dict[str, Any], refusal: RefusalRequest) -> ev.Event:
        return ev.BudgetExceededEvent(**call, payload=exceeded(breach, refusal.detail))

    detail = breach_detail(breach) + (_WITHHELD if ran else "")
    return _record_guarded(log, req, "budget_exceeded", detail, finding, run_tenant, producer)[0]


def exceeded(breach: Breach, detail: str | None) -> ev.BudgetExceeded:
    """The `budget.exceeded` payload of `breach`."""
    return ev.BudgetExceeded(
        budget=breach.budget_id,
        limit=breach.limit_micros / MICROS,
        used=breach.used_micros / MICROS,
        amount=breach.amount_micros / MICROS,
        counter_key=breach.counter_key,
        resets_at=None if breach.resets_at is None else ev.format_ts(breach.resets_at),
        scope=breach.scope or None,
        detail=detail,
    )


def detected(conn: Connection, loops: tuple[LoopKey, ...]) -> str | None:
    """The rule of the first of `loops` whose pattern was found to loop in its window, or None."""
    if not loops:
        return None
    found = (
        conn.execute(
            select(loop_marks.c.pattern_key).where(
                loop_marks.c.pattern_key.in_([k.pattern for k in loops]), loop_marks.c.kind == "detected"
            )
        )
        .scalars()
        .all()
    )
    return next((k.rule_id for k in loops if k.pattern in found), None)


def _record_guarded(
    log: Append,
    req: CallRequest,
    reason: str,
    detail: str,
    finding: Callable[[dict[str, Any], RefusalRequest], ev.Event | None],
    run_tenant: str | None,
    producer: str,
) -> tuple[CallView, ev.Event]:
    """Record a call one of the store's guards (a budget, a loop rule) refused: requested (claiming,
    charging and counting nothing), the guard's finding if it has one, then denied with `reason`.
    Returns the call and its `tool_call.denied` as sealed."""
    refusal = bounded(_refusal_of(req, reason, detail))
    who = refusal.identity
    base = _base(who, req.policy_version, producer)
    if run_tenant is None:
        _add_run_started(log, who, base)
    decision = DecisionRecord("deny", reason, req.policy_version, message=refusal.detail)
    requested = log.add(
        ev.ToolCallRequestedEvent(
            **base,
            tool_call_id=who.tool_call_id,
            payload=_requested(who, decision, claims_key=False, summary=refusal.summary),
        )
    )
    call = {**base, "tool_call_id": who.tool_call_id, "causation_id": requested.event_id}
    if (found := finding(call, refusal)) is not None:
        log.add(found)
    denied = log.add(
        ev.ToolCallDeniedEvent(**call, payload=ev.ToolCallDenied(reason=reason, message=refusal.detail))
    )
    log.flush()
    return log.call(who.tool_call_id), denied


MICROS = 1_000_000
"""Counters hold millionths of a budget's unit."""


def breach_detail(breach: Breach) -> str:
    resets = "at the end of the run" if breach.resets_at is None else f"at {ev.format_ts(breach.resets_at)}"
    return (
        f"budget {breach.budget_id!r} is used up: {breach.used_micros / MICROS:g} of "
        f"{breach.limit_micros / MICROS:g} used, this call needs {breach.amount_micros / MICROS:g}; "
        f"it resets {resets}"
    )


def refuse(conn: Connection, req: RefusalRequest, *, producer: str) -> CallView:
    """Record a call refused before it could claim a key: requested, then denied."""
    log = Append(conn)
    found = _RUN_TENANT.one_or_none(conn, {"b_run_id": req.identity.run_id})
    run_tenant: str | None = None if found is None else found.tenant
    _check_run_tenant(req.identity.run_id, run_tenant, req.identity.tenant)
    _note_retry(conn, log, req.identity, req.policy_version, producer)
    return _record_refusal(conn, log, req, run_tenant, producer)


_RETRIED = Statement(
    select(events.c.seq)
    .where(events.c.tool_call_id == bindparam("b_call"), events.c.type == "tool_call.retry_requested")
    .limit(1)
)

_LOGGED = Statement(select(events.c.seq).where(events.c.tool_call_id == bindparam("b_call")).limit(1))


def _note_retry(conn: Connection, log: Append, who: CallIdentity, policy_version: str, producer: str) -> None:
    """Record `tool_call.retry_requested` on the call `who` re-runs, if it is a retry (under the head lock).

    Raises:
        RetryRefused: the original is not a settled failure, was retried before, or the person who
            asked is revoked (nothing is recorded).
    """
    link = who.retry
    if link is None:
        return
    original = load_call(conn, link.of)
    if original is None or original.tenant != who.tenant:
        raise RetryRefused("not_found", f"no tool call {link.of}")
    if original.status != "failed" or original.contradicted:
        state = "contradicted" if original.contradicted else original.status
        raise RetryRefused("retry_not_failed", f"call {link.of} is {state}; only a failed call is retried")
    if _RETRIED.one_or_none(conn, {"b_call": link.of}) is not None:
        raise RetryRefused("already_retried", f"call {link.of} was retried before; retry its retry instead")
    if _LOGGED.one_or_none(conn, {"b_call": link.of}) is None:
        # `writ store archive` moved its events to files: whether it was retried is no longer known here.
        raise RetryRefused("not_found", f"call {link.of}'s events are archived: it can no longer be retried")
    if not link.break_glass:
        revoked = conn.execute(
            select(revocations.c.subject).where(
                revocations.c.tenant == who.tenant, revocations.c.subject == link.requested_by
            )
        ).first()
        if revoked is not None:
            raise RetryRefused("principal_revoked", f"{link.requested_by} is revoked in tenant {who.tenant}")
    payload = ev.ToolCallRetryRequested(
        requested_by=link.requested_by,
        reason=link.reason,
        break_glass=link.break_glass,
        retry_tool_call_id=who.tool_call_id,
        retry_number=link.number,
        idempotency_key=who.idempotency_key,
        same_key=link.same_key,
    )
    log.add(
        ev.ToolCallRetryRequestedEvent(
            occurred_at=ev.format_ts(who.now),
            producer=producer,
            run_id=original.run_id,
            tool_call_id=original.tool_call_id,
            capability_id=original.capability_id,
            capability_version=original.capability_version,
            policy_version=policy_version,
            correlation_id=original.correlation_id,
            tenant=original.tenant,
            payload=payload,
        )
    )


def _record_refusal(
    conn: Connection, log: Append, req: RefusalRequest, run_tenant: str | None, producer: str
) -> CallView:
    req = bounded(req)
    who = req.identity
    base = _base(who, req.policy_version, producer)
    if run_tenant is None:
        _add_run_started(log, who, base)
    decision = DecisionRecord("deny", req.reason, req.policy_version, message=req.detail)
    requested = log.add(
        ev.ToolCallRequestedEvent(
            **base,
            tool_call_id=who.tool_call_id,
            payload=_requested(who, decision, claims_key=False, summary=req.summary),
        )
    )
    denied = ev.ToolCallDenied(reason=req.reason, detail=req.detail)
    log.add(
        ev.ToolCallDeniedEvent(
            **base, tool_call_id=who.tool_call_id, causation_id=requested.event_id, payload=denied
        )
    )
    log.flush()
    return log.call(who.tool_call_id)


def record_outcome(conn: Connection, cmd: RecordOutcome, *, producer: str) -> CallView:
    """Record what the executor observed for a call this writer dispatched under lease `token`.

    Raises:
        NotFound: no such call.
        StaleLease: the call is not `dispatching`, or is fenced at a newer token: this writer no
            longer owns it.
    """
    tool_call_id, outcome, now = cmd.tool_call_id, cmd.outcome, cmd.now
    log = Append(conn)
    row = fenced(conn, tool_call_id, cmd.token, "dispatching", ENVELOPE_BY_ID)
    envelope = call_envelope(row, now, producer)
    event = outcome_event(envelope, outcome)
    log.add(event)
    log.flush()
    return log.call(tool_call_id)


def outcome_event(
    envelope: dict[str, Any], outcome: OutcomeRecord
) -> ev.ToolCallCompletedEvent | ev.ToolCallFailedEvent | ev.ToolCallResultUnknownEvent:
    """The event recording what an executor observed, with `envelope`'s fields."""
    result = dict(outcome.result) if outcome.result is not None else None
    if outcome.kind == "completed":
        payload = ev.ToolCallCompleted(
            result=result, external_request_id=outcome.external_request_id, evidence=dict(outcome.evidence)
        )
        return ev.ToolCallCompletedEvent(**envelope, payload=payload)
    if outcome.kind == "failed":
        failed = ev.ToolCallFailed(
            error=outcome.error, detail=outcome.detail, result=result, evidence=dict(outcome.evidence)
        )
        return ev.ToolCallFailedEvent(**envelope, payload=failed)
    unknown = ev.ToolCallResultUnknown(
        error=outcome.error, detail=outcome.detail, evidence=dict(outcome.evidence)
    )
    return ev.ToolCallResultUnknownEvent(**envelope, payload=unknown)


def _refusal_of(req: CallRequest, reason: str, detail: str) -> RefusalRequest:
    # A refusal records the same identity as the request it refuses.
    return RefusalRequest(req.identity, reason, detail, req.policy_version, req.summary)


def _check_run_tenant(run_id: str | None, run_tenant: str | None, tenant: str) -> None:
    if run_tenant is not None and run_tenant != tenant:
        raise StoreError(f"run {run_id} belongs to another tenant")


def _joinable(existing: CallView, req: CallRequest) -> bool:
    # A derived key only stands for "the same call again, soon": in flight, or completed inside the window.
    if existing.status in IN_FLIGHT_STATUSES:
        return True
    # A contradicted verdict is no ground to act again: the effect may have happened after all.
    if existing.verification_status == "inconclusive":
        return True
    window = timedelta(seconds=req.dedupe_window_s)
    return existing.status == "completed" and req.identity.now - existing.created_at < window


def _base(who: CallIdentity, policy_version: str, producer: str) -> dict[str, Any]:
    return {
        "occurred_at": ev.format_ts(who.now),
        "producer": producer,
        "run_id": who.run_id,
        "capability_id": who.capability_id,
        "capability_version": who.capability_version,
        "policy_version": policy_version,
        "correlation_id": who.correlation_id,
        "tenant": who.tenant,
    }


def _add_run_started(log: Append, who: CallIdentity, base: dict[str, Any]) -> None:
    """Start the call's run, unless it is in none (a client with neither a runId nor a session)."""
    if who.run_id is None:
        return
    payload = ev.RunStarted(
        tenant=who.tenant, subject=who.subject, client_run_id=who.client_run_id, origin=who.run_origin
    )
    log.add(ev.RunStartedEvent(**base, payload=payload))


def _requested(
    who: CallIdentity, decision: DecisionRecord, *, claims_key: bool, **extra: Any
) -> ev.ToolCallRequested:
    return ev.ToolCallRequested(
        tool_name=who.tool_name,
        subject=who.subject,
        arguments=dict(who.arguments),
        action_hash=who.action_hash,
        idempotency_key=who.idempotency_key,
        key_source=who.key_source,
        claims_key=claims_key,
        principal=who.principal.to_json(),
        decision=decision.to_json(),
        contract_hash=who.contract_hash,
        trace_context=dict(who.trace_context) if who.trace_context else None,
        retry_of=who.retry.of if who.retry else None,
        retry_number=who.retry.number if who.retry else None,
        **{"effect_class": "", "summary": "", "external_request_id": "", "dedupe_window_s": 0, **extra},
    )


def _call_requested(
    req: CallRequest, *, claims_key: bool, supersedes: str | None = None
) -> ev.ToolCallRequested:
    return _requested(
        req.identity,
        req.decision,
        claims_key=claims_key,
        supersedes=supersedes,
        effect_class=req.effect_class,
        summary=req.summary,
        external_request_id=req.external_request_id,
        dedupe_window_s=req.dedupe_window_s,
        # Only the call that claims the key is charged: a conflict is refused and counts nothing.
        charges=([charged(c) for c in req.charges] or None) if claims_key else None,
        loops=([_marked(k) for k in req.loops] or None) if claims_key else None,
    )


def charged(charge: Charge) -> ev.BudgetCharged:
    return ev.BudgetCharged(
        budget=charge.budget_id,
        key=charge.counter_key,
        amount_micros=charge.amount_micros,
        window_start=None if charge.window_start is None else ev.format_ts(charge.window_start),
        resets_at=None if charge.resets_at is None else ev.format_ts(charge.resets_at),
    )


def _marked(key: LoopKey) -> ev.LoopMarked:
    return ev.LoopMarked(
        rule=key.rule_id,
        key=key.pattern,
        window_start=ev.format_ts(key.window_start),
        resets_at=ev.format_ts(key.resets_at),
    )


def _record_new(
    log: Append,
    req: CallRequest,
    *,
    supersedes: str | None,
    run_is_new: bool,
    producer: str,
    passed: Breach | None = None,
    sent_key: str | None = None,
) -> ev.Event:
    """Append the events of an admitted call; returns the last (what a later event of it is caused by).

    `passed`: the budget it passed, recorded (`budget.exceeded`) before the approval it was sent to;
    `sent_key`: the key its dispatch sends, if allowed outright (`first_sent_key`; else scoped)."""
    who = req.identity
    base = _base(who, req.policy_version, producer)
    if run_is_new:
        _add_run_started(log, who, base)
    call = {**base, "tool_call_id": who.tool_call_id}
    payload = _call_requested(req, claims_key=True, supersedes=supersedes)
    requested = log.add(ev.ToolCallRequestedEvent(**call, payload=payload))
    call["causation_id"] = requested.event_id
    if passed is not None:
        detail = f"{breach_detail(passed)}; a person decides whether it runs"
        log.add(ev.BudgetExceededEvent(**call, payload=exceeded(passed, detail)))
    decision = req.decision
    effect = decision.effect
    if effect == "deny":
        denied = ev.ToolCallDenied(
            reason=decision.reason or "denied", rule_id=decision.rule_id, message=decision.message
        )
        return log.add(ev.ToolCallDeniedEvent(**call, payload=denied))
    if effect == "require_approval":
        if req.approval_id is None or req.approval_expires_at is None:
            raise StoreError("a require_approval decision needs approval_id and approval_expires_at")
        need = decision.approval
        required = ev.ApprovalRequired(
            approval_id=req.approval_id,
            approver_role=need.approver_role if need else "",
            expires_at=ev.format_ts(req.approval_expires_at),
            requester_may_approve=need.requester_may_approve if need else False,
            action_hash=who.action_hash,
            requester=who.subject,
        )
        return log.add(ev.ApprovalRequiredEvent(**call, approval_id=req.approval_id, payload=required))
    if effect == "allow" and req.confirmation_id is not None:
        if req.confirmation_expires_at is None:
            raise StoreError("a call awaiting confirmation needs confirmation_expires_at")
        asked = ev.ConfirmationRequired(
            confirmation_id=req.confirmation_id,
            action_hash=who.action_hash,
            expires_at=ev.format_ts(req.confirmation_expires_at),
            requester=who.subject,
        )
        return log.add(ev.ConfirmationRequiredEvent(**call, payload=asked))
    if effect == "allow":
        dispatching = ev.ToolCallDispatching(
            attempt=1,
            idempotency_key=sent_key or who.sent_key,
            external_request_id=req.external_request_id,
            **grant(req.lease_owner, 0, who.now, req.lease_s),
        )
        return log.add(ev.ToolCallDispatchingEvent(**call, payload=dispatching))
    raise StoreError(f"unknown decision effect {effect!r}")


def _record_conflict(
    conn: Connection, log: Append, req: CallRequest, existing: CallView, *, run_is_new: bool, producer: str
) -> CallView:
    who = req.identity
    base = _base(who, req.policy_version, producer)
    if run_is_new:
        _add_run_started(log, who, base)
    call = {**base, "tool_call_id": who.tool_call_id}
    requested = log.add(ev.ToolCallRequestedEvent(**call, payload=_call_requested(req, claims_key=False)))
    denied = ev.ToolCallDenied(
        reason="idempotency_conflict",
        message=f"idempotency key is held by call {existing.tool_call_id} with a different action",
        existing_tool_call_id=existing.tool_call_id,
    )
    log.add(ev.ToolCallDeniedEvent(**call, causation_id=requested.event_id, payload=denied))
    log.flush()
    return log.call(who.tool_call_id)
