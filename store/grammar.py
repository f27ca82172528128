"""The event grammar: which sequences of events the store can write, checked over a whole log.

Every write of the store is a compare-and-set under the log-head lock: an approval is decided only
while it awaits, an approved call is dispatched only once, an outcome is recorded only for a call that
is dispatching, a key is claimed only when free. So a log the store wrote obeys the state machine
below, per call (DESIGN §3) and per idempotency key, and an event that breaks it was put there by
something else: a forged `tool_call.dispatching` of a call nobody approved, a second dispatch under
one key, an approval decided by its own requester. `Grammar.check` follows the log event by event
and names the first such event.

`TRANSITIONS` is the call's life: (state, event type) -> next state. A call starts in the state its
`tool_call.requested` puts it in: `refused` when it claims no key (a conflict, a refusal at the edge,
a revoked subject, a budget breach, a loop; only its denial may follow), otherwise by its decision's effect.
The guards in `Grammar` add what a state name cannot hold: who holds a key, who may approve, who is
revoked, which attempt a dispatch is.
"""

from __future__ import annotations

from datetime import timedelta

from store import events as ev
from store.keys import scoped_key
from store.model import GrammarViolation

TRANSITIONS: dict[tuple[str, str], str] = {
    ("refused", "budget.exceeded"): "refused",
    ("refused", "loop.detected"): "refused",
    ("refused", "tool_call.denied"): "denied",
    ("decided:deny", "tool_call.denied"): "denied",
    ("decided:require_approval", "approval.required"): "approval_pending",
    # a budget saying require_approval was passed: a person decides the call
    ("decided:require_approval", "budget.exceeded"): "decided:require_approval",
    ("decided:allow", "confirmation.required"): "awaiting_confirmation",
    ("decided:allow", "tool_call.dispatching"): "dispatching",
    ("approval_pending", "approval.granted"): "approved",
    ("approval_pending", "approval.rejected"): "rejected",
    ("approval_pending", "approval.expired"): "expired",
    ("approved", "tool_call.dispatching"): "dispatching",
    ("approved", "tool_call.denied"): "denied",  # re-authorization at execution refused it
    ("approved", "budget.exceeded"): "approved",  # a budget checked again at execution, then denied
    ("awaiting_confirmation", "confirmation.given"): "confirmed",
    ("awaiting_confirmation", "confirmation.declined"): "denied",
    ("awaiting_confirmation", "confirmation.expired"): "expired",
    ("confirmed", "tool_call.dispatching"): "dispatching",
    ("dispatching", "tool_call.completed"): "completed",
    ("dispatching", "tool_call.failed"): "failed",
    ("dispatching", "tool_call.result_unknown"): "result_unknown",
    ("result_unknown", "reconciliation.started"): "result_unknown",
    ("result_unknown", "reconciliation.inconclusive"): "result_unknown",
    ("result_unknown", "reconciliation.escalated"): "result_unknown",
    ("result_unknown", "reconciliation.resolved"): "settled",
    ("result_unknown", "tool_call.dispatching"): "dispatching",  # a retry to a deduplicating backend
    ("completed", "reconciliation.contradicted"): "completed",
    ("failed", "reconciliation.contradicted"): "failed",
    ("completed", "reconciliation.resolved"): "settled",  # a person settles a contradicted call
    ("failed", "reconciliation.resolved"): "settled",
    ("failed", "tool_call.retry_requested"): "failed",  # a person re-runs it as a new call
    # a failure found by looking after the horizon, looked up again: it stays failed
    ("failed", "reconciliation.started"): "failed",
    ("failed", "reconciliation.rechecked"): "failed",
}
"""(state, event type) -> the call's next state; `settled` is `completed` or `failed` by the verdict."""

IN_FLIGHT: frozenset[str] = frozenset(
    {
        "decided:deny",
        "decided:require_approval",
        "decided:allow",
        "approval_pending",
        "approved",
        "awaiting_confirmation",
        "confirmed",
        "dispatching",
        "result_unknown",
    }
)
"""States in which a call's key may not be taken over by another (it would be joined instead)."""

CALL_FREE_TYPES: frozenset[str] = frozenset(
    {
        "run.started",
        "run.stopped",
        "run.resumed",
        "principal.revoked",
        "principal.restored",
        "loop.detected",
        "oauth.client_revoked",
        "security.auth_failed",
        "security.unknown_tool",
        "security.edge_refused",
        "security.oauth_refused",
    }
)
"""Event types that need not name a call; every other type moves a call along `TRANSITIONS`."""

_Key = tuple[str, str, str]


class _Call:
    """What the grammar remembers of one call: its state and what the guards need."""

    __slots__ = (
        "approval_id",
        "asked_by",
        "approved_by",
        "attempts",
        "contradicted",
        "created_at",
        "effect_class",
        "escalated",
        "key",
        "recheck_due",
        "rechecking",
        "requester",
        "requester_may_approve",
        "retried_by",
        "retry_asked_by",
        "retry_same_key",
        "run_id",
        "sent_key",
        "state",
        "tenant",
    )

    def __init__(self, state: str, key: _Key, requester: str, tenant: str, created_at: str) -> None:
        self.run_id: str | None = None
        self.state = state
        self.key = key
        self.requester = requester
        self.tenant = tenant
        self.created_at = created_at
        self.effect_class = ""
        self.approval_id: str | None = None
        self.requester_may_approve = False
        self.approved_by: str | None = None
        self.attempts = 0
        self.contradicted = False
        self.escalated = False
        self.retried_by: str | None = None
        self.retry_asked_by: str | None = None
        """Who asked for that retry (the `requested_by` of this call's `tool_call.retry_requested`)."""
        self.asked_by: str | None = None
        """For a retry of a failed call, who asked for it: they stand to it as its requester does."""
        self.retry_same_key = False
        """The call a `tool_call.retry_requested` of this one named (one retry per call)."""
        self.recheck_due = False
        """A re-check of its `failed` verdict is scheduled (`recheck_at`, then `next_attempt_at`)."""
        self.rechecking = False
        """A re-check lease was granted and has recorded nothing yet."""
        self.sent_key: str | None = None
        """The key its last dispatch sent the backend."""


class Grammar:
    """Follows a log in seq order; `check` returns the first event that breaks the grammar."""

    def __init__(self) -> None:
        self._calls: dict[str, _Call] = {}
        self._holders: dict[_Key, str] = {}
        """Who holds each (tenant, subject, idempotency key): the effect ledger as the log builds it."""
        self._runs: dict[str, str | None] = {}
        self._stopped: set[str] = set()
        """Runs stopped and not resumed: none of their calls may claim a key, be approved or run."""
        self._revoked: set[tuple[str | None, str]] = set()

    def check(self, event: ev.Event) -> GrammarViolation | None:
        """Take `event` as the next one; a violation if no log the store writes could hold it here."""
        try:
            self._take(event)
        except _Broken as broken:
            return GrammarViolation(event.seq, broken.rule, broken.detail, event.tool_call_id)
        return None

    def _take(self, event: ev.Event) -> None:
        if isinstance(event, ev.RunStartedEvent):
            self._run_started(event)
        elif isinstance(event, ev.RunStoppedEvent | ev.RunResumedEvent):
            self._run_control(event)
        elif isinstance(event, ev.PrincipalRevokedEvent):
            self._revoked.add((event.tenant, event.payload.subject))
        elif isinstance(event, ev.PrincipalRestoredEvent):
            who = (event.tenant, event.payload.subject)
            if who not in self._revoked:
                raise _Broken(
                    "restored_unrevoked", f"{event.payload.subject} is restored but was not revoked"
                )
            self._revoked.discard(who)
        elif isinstance(event, ev.ToolCallRequestedEvent):
            self._requested(event)
        elif event.type not in CALL_FREE_TYPES:
            self._move(event)

    def _run_started(self, event: ev.RunStartedEvent) -> None:
        run_id = event.run_id or ""
        if run_id in self._runs:
            raise _Broken("run_started_twice", f"run {run_id} was started before")
        self._runs[run_id] = event.tenant

    def _run_control(self, event: ev.RunStoppedEvent | ev.RunResumedEvent) -> None:
        run_id = event.run_id or ""
        if run_id not in self._runs:
            raise _Broken("run_not_started", f"{event.type} names run {run_id}, never started")
        if self._runs[run_id] != event.tenant:
            raise _Broken("run_of_another_tenant", f"run {run_id} belongs to another tenant")
        stopping = isinstance(event, ev.RunStoppedEvent)
        if stopping == (run_id in self._stopped):
            state = "stopped" if stopping else "not stopped"
            raise _Broken("run_control_out_of_order", f"{event.type} of run {run_id}, which is {state}")
        if stopping:
            self._stopped.add(run_id)
        else:
            self._stopped.discard(run_id)

    def _requested(self, event: ev.ToolCallRequestedEvent) -> None:
        p = event.payload
        tool_call_id = event.tool_call_id or ""
        if tool_call_id in self._calls:
            raise _Broken("requested_twice", f"call {tool_call_id} was requested before")
        run_id = event.run_id
        if run_id is not None:  # a call in no run (no runId, no session) names none
            if run_id not in self._runs:
                raise _Broken("run_not_started", f"call {tool_call_id} names run {run_id}, never started")
            if self._runs[run_id] != event.tenant:
                raise _Broken("run_of_another_tenant", f"run {run_id} belongs to another tenant")
        asked_by = None
        if p.retry_of is not None:
            original = self._calls.get(p.retry_of)
            if original is None or original.retried_by != tool_call_id:
                raise _Broken(
                    "retry_unrequested", f"call {tool_call_id} retries {p.retry_of}, which nobody retried"
                )
            asked_by = original.retry_asked_by
        key = (event.tenant or "", p.subject, p.idempotency_key)
        state = "refused"
        if p.claims_key:
            if (event.tenant, p.subject) in self._revoked:
                raise _Broken("claim_by_revoked", f"{p.subject} claims a key while revoked")
            if run_id in self._stopped:
                raise _Broken(
                    "claim_in_stopped_run", f"call {tool_call_id} claims a key in stopped run {run_id}"
                )
            self._claim(event, key)
            state = f"decided:{p.decision.get('effect')}"
        call = _Call(state, key, p.subject, event.tenant or "", event.occurred_at)
        call.effect_class = p.effect_class
        call.run_id, call.asked_by = run_id, asked_by
        self._calls[tool_call_id] = call

    def _claim(self, event: ev.ToolCallRequestedEvent, key: _Key) -> None:
        p = event.payload
        holder = self._holders.get(key)
        if p.supersedes is None:
            if holder is not None:
                raise _Broken(
                    "key_claimed_twice", f"key {p.idempotency_key!r} is held by call {holder}, claimed again"
                )
        else:
            if holder != p.supersedes:
                raise _Broken(
                    "takeover_of_unheld_key",
                    f"takes key {p.idempotency_key!r} over from call {p.supersedes}, which does not hold it",
                )
            why = self._not_supersedable(self._calls[holder], event)
            if why is not None:
                raise _Broken("key_taken_over_too_soon", f"takes key {p.idempotency_key!r} over: {why}")
        self._holders[key] = event.tool_call_id or ""

    @staticmethod
    def _not_supersedable(held: _Call, event: ev.ToolCallRequestedEvent) -> str | None:
        # The store joins instead of taking over (recording.admit): client keys, calls in flight,
        # contradicted verdicts, and completed calls inside the new call's dedupe window. A retry a
        # person asked for takes its failed original's key over (`_retry_requested` checked it).
        if event.payload.retry_of is not None and event.payload.retry_of == event.payload.supersedes:
            if not held.retry_same_key:
                return "its retry was asked for under a new key"
            return None if held.state == "failed" else f"the call it retries is {held.state}"
        if event.payload.key_source != "derived":
            return "a client's key is never taken over"
        if held.state in IN_FLIGHT:
            return f"its holder is still {held.state}"
        if held.contradicted:
            return "its holder's verdict is contradicted"
        window = timedelta(seconds=event.payload.dedupe_window_s)
        if (
            held.state == "completed"
            and ev.parse_ts(event.occurred_at) - ev.parse_ts(held.created_at) < window
        ):
            return "its holder completed inside the dedupe window"
        return None

    def _move(self, event: ev.Event) -> None:
        tool_call_id = event.tool_call_id
        call = self._calls.get(tool_call_id or "")
        if call is None:
            raise _Broken("unknown_call", f"{event.type} names call {tool_call_id}, never requested")
        after = TRANSITIONS.get((call.state, event.type))
        if after is None:
            raise _Broken(_rule_for(call.state, event.type), f"{event.type} of a call that is {call.state}")
        self._guard(call, event)
        if isinstance(event, ev.ReconciliationResolvedEvent):
            after = "completed" if event.payload.verdict == "confirmed_success" else "failed"
        call.state = after

    def _guard(self, call: _Call, event: ev.Event) -> None:
        if isinstance(event, ev.ApprovalRequiredEvent):
            call.approval_id = event.payload.approval_id
            call.requester_may_approve = event.payload.requester_may_approve
        elif isinstance(event, ev.ApprovalGrantedEvent | ev.ApprovalRejectedEvent):
            self._decided(call, event)
        elif isinstance(event, ev.ApprovalExpiredEvent):
            self._same_approval(call, event)
        elif isinstance(event, ev.ToolCallDispatchingEvent):
            self._dispatching(call, event)
        elif isinstance(event, ev.ToolCallRetryRequestedEvent):
            self._retry_requested(call, event)
        elif isinstance(event, ev.ReconciliationStartedEvent) and call.escalated:
            raise _Broken("reconciled_after_escalation", "a lookup started on a call handed to a person")
        elif isinstance(event, ev.ReconciliationStartedEvent):
            self._started(call, event)
        elif isinstance(event, ev.ReconciliationRecheckedEvent):
            if not call.rechecking:
                raise _Broken("recheck_unscheduled", "a re-check recorded without a re-check lease")
            call.rechecking = False
            call.recheck_due = event.payload.next_recheck_at is not None
        elif isinstance(event, ev.ReconciliationEscalatedEvent):
            call.escalated = True
        elif isinstance(event, ev.ToolCallResultUnknownEvent):
            call.escalated = False  # unknown again (after a retry): due for lookups again, as projected
        elif isinstance(event, ev.ReconciliationResolvedEvent):
            if call.state != "result_unknown" and not call.contradicted:
                raise _Broken("resettled", f"reconciliation.resolved of a call settled {call.state}")
            call.contradicted = call.escalated = False
            call.recheck_due, call.rechecking = event.payload.recheck_at is not None, False
        elif isinstance(event, ev.ReconciliationContradictedEvent):
            agrees = "completed" if event.payload.verdict == "confirmed_success" else "failed"
            if agrees == call.state:
                raise _Broken("contradiction_agrees", f"a contradiction that agrees with {call.state}")
            call.contradicted = True
            call.recheck_due = call.rechecking = False

    @staticmethod
    def _started(call: _Call, event: ev.ReconciliationStartedEvent) -> None:
        recheck = event.payload.method == ev.RECHECK
        if recheck != (call.state == "failed"):
            raise _Broken("recheck_unscheduled", f"a {event.payload.method} of a call that is {call.state}")
        if recheck:
            if not call.recheck_due:
                raise _Broken("recheck_unscheduled", "a re-check of a failure none was scheduled for")
            call.rechecking = True

    def _retry_requested(self, call: _Call, event: ev.ToolCallRetryRequestedEvent) -> None:
        p = event.payload
        if call.contradicted:
            raise _Broken("retry_of_contradicted", "a retry of a call whose failure is contradicted")
        if call.retried_by is not None:
            raise _Broken("retried_twice", f"retried before, by call {call.retried_by}")
        if not p.break_glass and (event.tenant, p.requested_by) in self._revoked:
            raise _Broken("retry_by_revoked", f"{p.requested_by} asked for a retry while revoked")
        call.retried_by, call.retry_asked_by = p.retry_tool_call_id, p.requested_by
        call.retry_same_key = p.same_key

    def _same_approval(self, call: _Call, event: ev.Envelope) -> None:
        if event.approval_id != call.approval_id:
            raise _Broken(
                "approval_mismatch", f"names approval {event.approval_id}, the call awaits {call.approval_id}"
            )

    def _decided(self, call: _Call, event: ev.ApprovalGrantedEvent | ev.ApprovalRejectedEvent) -> None:
        self._same_approval(call, event)
        p = event.payload
        if not isinstance(event, ev.ApprovalGrantedEvent):
            return
        if call.run_id in self._stopped:
            raise _Broken("approval_in_stopped_run", f"approved while run {call.run_id} is stopped")
        if p.decided_by == call.requester and not call.requester_may_approve:
            raise _Broken("self_approval", f"{p.decided_by} approved their own call")
        if p.decided_by == call.asked_by and not call.requester_may_approve:
            # Who asked for a retry stands to it as its requester does (`store.approving`).
            raise _Broken("self_approval", f"{p.decided_by} asked for this retry and approved it")
        if not p.break_glass and (event.tenant, p.decided_by) in self._revoked:
            raise _Broken("approval_by_revoked", f"{p.decided_by} approved while revoked")
        call.approved_by = p.decided_by

    def _dispatching(self, call: _Call, event: ev.ToolCallDispatchingEvent) -> None:
        p = event.payload
        holder = self._holders.get(call.key)
        if holder != event.tool_call_id:
            raise _Broken(
                "dispatch_without_key",
                f"dispatched under key {call.key[2]!r}, held by call {holder}: a second effect for one key",
            )
        if call.state == "decided:allow" and call.effect_class == "confirm":
            raise _Broken("dispatch_without_confirmation", "a confirm capability dispatched unconfirmed")
        retry = call.state == "result_unknown"
        if retry and p.retry_of_attempt != call.attempts:
            raise _Broken(
                "redispatch_unmarked",
                f"dispatched again after result_unknown without naming attempt {call.attempts} as retried",
            )
        if not retry and p.retry_of_attempt is not None:
            raise _Broken(
                "retry_without_unknown", "a dispatch marked as a retry of a call that was not unknown"
            )
        if p.attempt != call.attempts + 1:
            raise _Broken("attempt_out_of_order", f"attempt {p.attempt} follows attempt {call.attempts}")
        tenant, subject, key = call.key
        if p.idempotency_key not in (key, scoped_key(tenant, subject, key)):
            raise _Broken(
                "dispatch_under_another_key",
                f"sent under key {p.idempotency_key!r}, which is neither the call's key {key!r} nor that "
                "key scoped to its principal",
            )
        if retry and p.idempotency_key != call.sent_key:
            raise _Broken(
                "redispatch_under_another_key",
                f"re-sent under key {p.idempotency_key!r}, not {call.sent_key!r} as before: the backend "
                "cannot know it again",
            )
        call.sent_key = p.idempotency_key
        if call.state == "approved" and call.run_id in self._stopped:
            raise _Broken("dispatch_in_stopped_run", f"an approved call of stopped run {call.run_id} ran")
        if call.state in ("approved", "confirmed"):
            for who in (call.requester, call.approved_by):
                if who is not None and (call.tenant, who) in self._revoked:
                    raise _Broken("dispatch_for_revoked", f"dispatched after {who} was revoked")
        call.attempts = p.attempt


_EXPECTED_BEFORE: dict[str, str] = {
    "tool_call.completed": "outcome_without_dispatch",
    "tool_call.failed": "outcome_without_dispatch",
    "tool_call.result_unknown": "outcome_without_dispatch",
    "approval.granted": "decision_without_pending_approval",
    "approval.rejected": "decision_without_pending_approval",
}


_DISPATCH_RULES: dict[str, str] = {
    "decided:require_approval": "dispatch_without_approval",
    "approval_pending": "dispatch_without_approval",
    "rejected": "dispatch_without_approval",
    "expired": "dispatch_without_approval",
    "awaiting_confirmation": "dispatch_without_confirmation",
    "refused": "dispatch_of_denied_call",
    "decided:deny": "dispatch_of_denied_call",
    "denied": "dispatch_of_denied_call",
    "dispatching": "second_dispatch",
    "completed": "second_dispatch",
    "failed": "second_dispatch",
}


def _rule_for(state: str, event_type: str) -> str:
    if event_type == "tool_call.dispatching":
        return _DISPATCH_RULES.get(state, "dispatch_without_authorization")
    return _EXPECTED_BEFORE.get(event_type, "illegal_transition")


class _Broken(Exception):
    def __init__(self, rule: str, detail: str) -> None:
        super().__init__(detail)
        self.rule = rule
        self.detail = detail
