"""Reconciliation: settle `result_unknown` calls from evidence at the backend, never by guessing.

For each due call the reconciler takes a lease (`reconciliation.started`), then either
- looks the dispatch up (`executor.reconcile`: by idempotency key or external request id) and records
  `reconciliation.resolved` (found: `completed` with the found result; failed, or not found after
  the commit horizon: `failed`),
  or, while the lookup cannot tell, `reconciliation.inconclusive` with a backoff;
- or, for a backend that deduplicates on the key, re-sends the same key as a recorded retry: only a
  success settles the call, any other answer (a 409 "in progress" while the first request still runs,
  another error, silence) leaves it unknown, with `reconciliation.inconclusive` and a backoff;
- and after `max_attempts` (or with no way to learn the truth) `reconciliation.escalated`: a human
  settles it with `writ calls resolve`.

"Not found" proves a failure only after the capability's commit horizon. The dispatch lease guarantees
that Writ can no longer send, but a request already delivered can still be executed (a queue in front
of the backend, a lock wait, a paused process). The horizon ends `horizon_s` after the latest moment
the dispatch could have left (its record, or later by as much as the dispatcher may have paused before
sending, which its lease bounds): before it, a lookup that finds nothing is `inconclusive`, the call
stays `result_unknown` (its key claimed), and the next lookup is due no later than the horizon. A
found effect, or the backend's own report of failure, settles it at
any time.

A backend can break its horizon (commit a request it was told to refuse), and the key a `failed` frees
lets the same effect be sent again. So a `failed` that rests on finding nothing after the horizon is
looked up again, a few times (`ReconcilePolicy.recheck_after`), under a re-check lease of the same kind:
if the lookup finds this call's own effect, the verdict is contradicted (`reconciliation.contradicted`;
it stays `failed`, a person must look); otherwise the re-check is recorded (`reconciliation.rechecked`
naming the next one, none after the last). A `failed` a person recorded by hand on a call Writ had
looked up is looked up once more right after, then on the same schedule, counted from the later of
the horizon's end and the person's verdict (the store schedules the first: `resolve_by_human`). The
effect found under the key is this call's when the backend's record names its external request id or
tool call id, or, if it names neither, when no later call has been sent under the key: an honest
re-send's own effect is not flagged.

Every lookup and re-send uses the key the call was dispatched with (`CallView.sent_key`): the client's
key scoped to the principal (`store.keys`), so another principal's record under the same client key is
not found; or, for a call dispatched before keys were scoped, the plain key the backend got then. A
record that names another of Writ's dispatches is never this call's, in any lookup (`_look_up`): under
a plain key a backend holds every principal's effects in one space, and another principal's must
neither complete an unknown call nor contradict a failure.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

import anyio
import anyio.to_thread
from opentelemetry.trace import SpanKind

from capabilities.contract import Capability, CapabilityError, Invocation, ReconcileResult, ToolResult
from capabilities.results import mentions, names_another
from gateway.calls.actions import Redactor
from gateway.calls.dispatch import Dispatcher
from gateway.calls.pipeline import RegistryLike
from gateway.calls.tracing import ROOT, FirstTrace, links_to, no_first_trace, tracer
from gateway.reasons import ReasonCode
from store.commands import (
    EscalateReconciliation,
    RecordContradiction,
    RecordInconclusive,
    RecordRecheck,
    Redispatch,
    ResolveReconciliation,
    StartReconciliation,
    Verdict,
)
from store.events import RECHECK, format_ts
from store.model import CallView, StaleLease
from store.ports import Reconciliation

logger = logging.getLogger(__name__)

C = TypeVar("C")


DEFAULT_RECHECKS = (1.0, 3.0, 10.0)
"""A `failed` found after the commit horizon is looked up again 1, 3 and 10 horizons after it ended: a
backend that breaks its horizon most likely overshoots it a little (a queue drained slightly late), and
the last look bounds the work at about ten horizons."""


@dataclass(frozen=True, slots=True)
class ReconcilePolicy:
    max_attempts: int = 5
    """Lookups (or re-sends) before a call is escalated to a human."""
    backoff_s: float = 2.0
    """Wait after the first inconclusive lookup; doubles each time, up to `backoff_max_s`."""
    backoff_max_s: float = 300.0
    recheck_after: tuple[float, ...] = DEFAULT_RECHECKS
    """When a `failed` established by finding nothing after the commit horizon is looked up again: in
    multiples of the capability's horizon, counted from the end of the call's horizon, ascending; ()
    for never. Only the ones still ahead when the call is settled (or re-checked) are made."""


class Reconciler:
    """Settles due unknown calls; any number of replicas may run one (the store's leases arbitrate)."""

    def __init__(
        self,
        *,
        store: Reconciliation,
        registry: RegistryLike,
        dispatcher: Dispatcher,
        redactor: Redactor,
        owner: str,
        clock: Callable[[], datetime],
        policy: ReconcilePolicy = ReconcilePolicy(),
        first_trace: FirstTrace = no_first_trace,
        on_outcome: Callable[[str], None] | None = None,
    ) -> None:
        self._first_trace = first_trace
        self._on_outcome = on_outcome
        self._store = store
        self._redactor = redactor
        self._registry = registry
        self._dispatcher = dispatcher
        self._owner = owner
        self._clock = clock
        self._policy = policy

    async def run_once(self, limit: int = 20) -> int:
        """Try each due call once; returns how many this worker took a lease on."""
        due = await anyio.to_thread.run_sync(
            lambda: self._store.due_reconciliations(now=self._clock(), limit=limit)
        )
        taken = 0
        for call in due:
            try:
                taken += await self.settle(call)
            except StaleLease as exc:  # another replica or a human got there first
                logger.info("reconciliation of %s skipped: %s", call.tool_call_id, exc)
            except Exception:
                # One call's failure (a backend's answer no reader foresaw, a store error) must not keep
                # the calls due after it from being settled: it is logged and tried on a later pass.
                logger.exception("reconciliation of %s failed", call.tool_call_id)
        return taken

    async def settle(self, call: CallView) -> bool:
        """Take the call's reconciliation lease and act on it; False if another worker holds it.

        Each attempt is a trace of its own, linked to the one the call was requested in; its outcome
        (`confirmed_success`, `confirmed_failure`, `inconclusive`, `escalated`, `resent`; for a re-check
        of a `failed` verdict, `rechecked` or `contradicted`) is reported.

        Raises:
            StaleLease: the call was settled by someone else while this worker held the lease.
        """
        first = await anyio.to_thread.run_sync(self._first_trace, call.tool_call_id)
        with tracer.start_as_current_span(
            f"reconcile {call.tool_name}",
            context=ROOT,
            links=links_to(first),
            attributes={"writ.tool_call_id": call.tool_call_id, "writ.capability": call.capability_id},
        ) as span:
            outcome = "error"
            try:
                outcome = await self._settle(call)
            except StaleLease:
                outcome = "settled_elsewhere"
                raise
            finally:
                span.set_attribute("writ.reconciliation.outcome", outcome)
                if self._on_outcome is not None:
                    self._on_outcome(outcome)
        return outcome != "lease_held_elsewhere"

    async def _settle(self, call: CallView) -> str:
        if call.status == "failed":
            return await self._recheck(call)
        capability = self._capability(call)
        method = self._method(capability, call)
        leased = await self._lease(call, capability, method)
        if leased is None:
            return "lease_held_elsewhere"
        if capability is None or method == "none":
            return await self._no_way_to_learn(capability, leased)
        if method == "resend":
            return await self._resend(capability, leased)
        return await self._lookup(capability, leased)

    async def _no_way_to_learn(self, capability: Capability | None, call: CallView) -> str:
        if capability is not None and call.attempts > 1:
            # Re-sent to a backend that deduplicates on the key as often as allowed, and no answer was
            # a success: refusals (a 409 while the first request runs), errors or silence.
            detail = (
                f"sent {call.attempts} times under the same key and no answer was a success (the last: "
                f"{call.error or 'none'}); {call.capability_id} offers no lookup"
            )
            evidence = {"attempts": call.attempts, "last_error": call.error}
            return await self._escalate(call, ReasonCode.INCONCLUSIVE_AFTER_RETRIES, detail, evidence)
        reason = ReasonCode.NO_RECONCILIATION_METHOD if capability else ReasonCode.CAPABILITY_UNKNOWN
        return await self._escalate(call, reason, f"{call.capability_id} offers no way to learn the outcome")

    async def _lease(self, call: CallView, capability: Capability | None, method: str) -> CallView | None:
        """The call under a new reconciliation lease for `method` (the view carries its token); None
        when another worker took it, or it moved on, since `call` was read."""
        try:
            return await self._write(
                self._store.start_reconciliation,
                StartReconciliation(
                    call.tool_call_id,
                    expected_token=call.lease_token,
                    method=method,
                    owner=self._owner,
                    lease_s=self._dispatcher.lease_s(capability) if capability else 60.0,
                    now=self._clock(),
                ),
            )
        except StaleLease:
            return None

    def _capability(self, call: CallView) -> Capability | None:
        capability = self._registry.in_force(call.tool_name, call.capability_id)
        return capability if capability is not None and capability.id == call.capability_id else None

    def _method(self, capability: Capability | None, call: CallView) -> str:
        if capability is None:
            return "none"
        # A re-send needs the real arguments; redacted ones are stored only as hashes.
        if capability.dedupes_on_key and not capability.redact and call.attempts < self._policy.max_attempts:
            return "resend"
        return "lookup" if capability.reconcilable else "none"

    async def _look_up(self, capability: Capability, call: CallView) -> ReconcileResult:
        with tracer.start_as_current_span(
            f"lookup {capability.tool_name}",
            kind=SpanKind.CLIENT,
            attributes={"writ.capability": capability.ref},
        ) as span:
            asked = await self._ask_backend(capability, call)
            span.set_attribute("writ.verdict", asked.verdict)
        evidence = dict(asked.evidence)
        if asked.verdict == "succeeded" and asked.result is not None:
            # Whatever executor looked (a callable's lookup too): a record naming another dispatch of
            # Writ's and not this one is that dispatch's effect (another principal's under a plain key,
            # sent before keys were scoped; or a later re-send of the same effect).
            record, ids = asked.result.to_json(), (call.external_request_id, call.tool_call_id)
            if names_another(record, ids) and not mentions(record, ids):
                asked = ReconcileResult("not_found", evidence={**evidence, "records_of_others": 1})
        # What the backend's record says passes the echo guard first, as a dispatch's answer does: its
        # record may repeat a redacted argument, known here only by its salted digest.
        return ReconcileResult(
            asked.verdict,
            result=ToolResult.from_json(self._withhold(capability, call, asked.result.to_json()))
            if asked.result is not None
            else None,
            evidence=self._withhold(capability, call, dict(asked.evidence)),
        )

    async def _lookup(self, capability: Capability, call: CallView) -> str:
        # The backend's state is read some time during the lookup; judged at its start, the earliest.
        looked_up_at = self._clock()
        result = await self._look_up(capability, call)
        if result.verdict == "succeeded":
            return await self._resolve(
                call,
                "confirmed_success",
                result=result.result.to_json() if result.result is not None else None,
                evidence=dict(result.evidence),
            )
        if result.verdict == "failed":
            return await self._resolve(
                call,
                "confirmed_failure",
                evidence={**result.evidence, "verdict": "failed"},
                detail="the backend reports the effect failed",
            )
        if result.verdict == "not_found":
            return await self._not_found(capability, call, result, looked_up_at)
        if call.reconcile_attempts >= self._policy.max_attempts:
            return await self._escalate(
                call, ReasonCode.INCONCLUSIVE_AFTER_RETRIES, None, dict(result.evidence)
            )
        return await self._retry_later(call, dict(result.evidence), self._backoff(call))

    def _withhold(self, capability: Capability, call: CallView, data: Any) -> Any:
        return self._redactor.withhold_echoes(capability, call.arguments, data)

    async def _resolve(
        self,
        call: CallView,
        verdict: Verdict,
        *,
        evidence: dict[str, Any],
        result: dict[str, Any] | None = None,
        detail: str | None = None,
        recheck_at: datetime | None = None,
    ) -> str:
        try:
            await self._write(
                self._store.resolve_reconciliation,
                ResolveReconciliation(
                    call.tool_call_id,
                    token=call.lease_token,
                    verdict=verdict,
                    result=result,
                    evidence=evidence,
                    detail=detail,
                    now=self._clock(),
                    recheck_at=recheck_at,
                ),
            )
        except StaleLease:
            # Settled by someone else while we asked (a person): if the backend just said otherwise,
            # that is recorded beside their verdict and escalated, never dropped.
            contradiction = RecordContradiction(
                call.tool_call_id,
                source="lookup",
                verdict=verdict,
                evidence={**evidence, **({"result": result} if result is not None else {})},
                detail=detail or "the backend has the effect",
                now=self._clock(),
            )
            await anyio.to_thread.run_sync(self._store.record_contradiction, contradiction)
            raise
        return verdict

    async def _horizon(
        self, capability: Capability, call: CallView, looked_up_at: datetime
    ) -> tuple[datetime | None, datetime]:
        """When the call's latest dispatch was recorded, and when its commit horizon ends."""
        times = await anyio.to_thread.run_sync(lambda: self._store.dispatch_times(call.tool_call_id))
        sent_at = times[0] if times else None
        # The same deadline the dispatch sent to the backend. No record of the send (never expected):
        # count the horizon from now, which errs late.
        horizon_at = (
            self._dispatcher.commit_deadline(capability, *times)
            if times
            else looked_up_at + timedelta(seconds=capability.horizon_s)
        )
        return sent_at, horizon_at

    def _next_recheck(
        self,
        capability: Capability,
        horizon_at: datetime,
        after: datetime,
        counted_from: datetime | None = None,
    ) -> datetime | None:
        """The first re-check later than `after` (a lookup then would see nothing the one at `after` did
        not): the horizon's end while it is ahead (only a person's `failed` is looked up before it: the
        backend may commit until then); then the policy's schedule, counted from the horizon's end or
        from `counted_from` if later (a person's `failed`, recorded hours after it). None when none is
        left."""
        if after < horizon_at:
            return horizon_at
        start = max(horizon_at, counted_from) if counted_from is not None else horizon_at
        for factor in self._policy.recheck_after:
            at = start + timedelta(seconds=factor * capability.horizon_s)
            if at > after:
                return at
        return None

    async def _not_found(
        self, capability: Capability, call: CallView, result: ReconcileResult, looked_up_at: datetime
    ) -> str:
        sent_at, horizon_at = await self._horizon(capability, call, looked_up_at)
        evidence = {
            **result.evidence,
            "verdict": "not_found",
            "sent_at": format_ts(sent_at) if sent_at else None,
            "horizon_at": format_ts(horizon_at),
            "looked_up_at": format_ts(looked_up_at),
        }
        if looked_up_at >= horizon_at:
            return await self._resolve(
                call,
                "confirmed_failure",
                evidence=evidence,
                detail=f"the backend has no effect for key {call.sent_key}, looked up after the "
                "commit horizon",
                # A backend that breaks its horizon can still commit it: looked up again from then.
                recheck_at=self._next_recheck(capability, horizon_at, looked_up_at),
            )
        # The request may still be queued or running at the backend: nothing found is no evidence
        # yet. Not counted towards escalation; the horizon bounds how long this goes on.
        next_at = min(self._clock() + self._backoff(call), horizon_at)
        await self._write(
            self._store.record_inconclusive,
            RecordInconclusive(
                call.tool_call_id,
                token=call.lease_token,
                evidence={**evidence, "reason": ReasonCode.BEFORE_COMMIT_HORIZON},
                next_attempt_at=next_at,
                now=self._clock(),
            ),
        )
        return "inconclusive"

    async def _recheck(self, call: CallView) -> str:
        """Look a `failed` verdict up again under a re-check lease; the call's own effect found there
        contradicts it, anything else is recorded with the next re-check.

        Raises:
            StaleLease: the failure was contradicted or resolved while this worker looked.
        """
        capability = self._capability(call)
        leased = await self._lease(call, capability, RECHECK)
        if leased is None:
            return "lease_held_elsewhere"
        if capability is None or not capability.reconcilable:
            # Nothing to look with any more (the capability changed since): the verdict stands.
            missing = {"error": "no_lookup", "detail": f"{call.capability_id} offers no lookup now"}
            return await self._rechecked(leased, missing, None)
        looked_up_at = self._clock()
        result = await self._look_up(capability, leased)
        _, horizon_at = await self._horizon(capability, leased, looked_up_at)
        evidence: dict[str, Any] = {
            **result.evidence,
            "verdict": result.verdict,
            "horizon_at": format_ts(horizon_at),
            "looked_up_at": format_ts(looked_up_at),
        }
        found = result.result.to_json() if result.result is not None else None
        if result.verdict == "succeeded":
            other = await self._effect_of_another(leased, found)
            if other is None:
                return await self._contradict_failure(leased, evidence, found)
            evidence.update(other)
        # A person may settle an escalated call hours after its horizon, its backend still unable to
        # answer: counted from the horizon, the look at once would be the only one.
        by_hand = (
            await anyio.to_thread.run_sync(self._store.failed_by_hand_at, leased.tool_call_id)
            if leased.resolved_by is not None
            else None
        )
        next_at = self._next_recheck(capability, horizon_at, looked_up_at, counted_from=by_hand)
        return await self._rechecked(leased, evidence, next_at)

    async def _effect_of_another(self, call: CallView, found: dict[str, Any] | None) -> dict[str, Any] | None:
        """None when the effect found under the call's key is the call's own; else what is known of
        whose it is (evidence).

        A `failed` frees the key, and a re-send of the same effect goes out under it as a call of its
        own, with its own ids: its effect, found by a lookup by key, is no contradiction.
        """
        if found is not None and mentions(found, (call.external_request_id, call.tool_call_id)):
            return None
        # A record naming another dispatch was no record of this call's (`_look_up`): this one names
        # none, as from a backend that keeps no request id.
        holder = await anyio.to_thread.run_sync(
            lambda: self._store.find_call_by_key(call.tenant, call.subject, call.idempotency_key)
        )
        if holder is None or holder.tool_call_id == call.tool_call_id or holder.attempts == 0:
            return None  # nothing else was sent under the key since: the effect can only be this call's
        return {"effect_of": None, "key_held_by": holder.tool_call_id}

    async def _contradict_failure(
        self, call: CallView, evidence: dict[str, Any], found: dict[str, Any] | None
    ) -> str:
        contradiction = RecordContradiction(
            call.tool_call_id,
            source="lookup",
            verdict="confirmed_success",
            evidence={**evidence, **({"result": found} if found is not None else {})},
            detail=(
                f"a re-check found the effect of this call, which {call.resolved_by} settled failed by hand"
                if call.resolved_by
                else "a re-check found the effect of this call, settled failed because the backend had "
                "none after its commit horizon: the backend committed past its horizon"
            ),
            now=self._clock(),
            token=call.lease_token,
        )
        await anyio.to_thread.run_sync(self._store.record_contradiction, contradiction)
        logger.warning(
            "call %s was settled failed (%s), and the backend has its effect after all: recorded as a "
            "contradiction for a person to check",
            call.tool_call_id,
            f"by {call.resolved_by}" if call.resolved_by else "after its commit horizon",
        )
        return "contradicted"

    async def _rechecked(self, call: CallView, evidence: dict[str, Any], next_at: datetime | None) -> str:
        await self._write(
            self._store.record_recheck,
            RecordRecheck(
                call.tool_call_id,
                token=call.lease_token,
                evidence=evidence,
                next_recheck_at=next_at,
                now=self._clock(),
            ),
        )
        return "rechecked"

    def _backoff(self, call: CallView) -> timedelta:
        seconds = self._policy.backoff_s * 2 ** max(call.reconcile_attempts - 1, 0)
        return timedelta(seconds=min(seconds, self._policy.backoff_max_s))

    async def _retry_later(self, call: CallView, evidence: dict[str, Any], delay: timedelta) -> str:
        now = self._clock()
        await self._write(
            self._store.record_inconclusive,
            RecordInconclusive(
                call.tool_call_id,
                token=call.lease_token,
                evidence=evidence,
                next_attempt_at=now + delay,
                now=now,
            ),
        )
        return "inconclusive"

    async def _ask_backend(self, capability: Capability, call: CallView) -> ReconcileResult:
        executor = self._registry.executor(capability)
        invocation = self._invocation(capability, call)
        try:
            with anyio.fail_after(self._dispatcher.guard_s(capability)):
                return await executor.reconcile(invocation)
        except TimeoutError:
            return ReconcileResult("inconclusive", evidence={"error": "lookup_timeout"})
        except CapabilityError as exc:
            return ReconcileResult("inconclusive", evidence={"error": type(exc).__name__, "detail": str(exc)})

    async def _resend(self, capability: Capability, call: CallView) -> str:
        retry = await self._write(
            self._store.redispatch,
            Redispatch(
                call.tool_call_id,
                token=call.lease_token,
                owner=self._owner,
                lease_s=self._dispatcher.lease_s(capability),
                now=self._clock(),
            ),
        )
        # Same key, next attempt: the same path as any dispatch. Only a success settles the call; any
        # other answer leaves it unknown (`answer_to_resend`), and the next try waits its backoff as
        # after a lookup that could not tell.
        dispatched = await self._dispatcher.dispatch(capability, retry, dict(retry.arguments))
        after = dispatched.call
        if (
            dispatched.recorded
            and after.status == "result_unknown"
            and after.lease_token == retry.lease_token
        ):
            evidence = {"method": "resend", "attempt": after.attempts, "error": after.error}
            # Another worker may have taken the call up meanwhile: then its lease decides what is next.
            with contextlib.suppress(StaleLease):
                await self._retry_later(after, evidence, self._backoff(after))
        return "resent"

    async def _escalate(
        self, call: CallView, reason: str, detail: str | None, evidence: dict[str, Any] | None = None
    ) -> str:
        await self._write(
            self._store.escalate_reconciliation,
            EscalateReconciliation(
                call.tool_call_id,
                token=call.lease_token,
                reason=reason,
                detail=detail,
                evidence=evidence or {},
                now=self._clock(),
            ),
        )
        return "escalated"

    def _invocation(self, capability: Capability, call: CallView) -> Invocation:
        return Invocation(
            capability=capability,
            arguments=dict(call.arguments),
            # The key the backend got: scoped, or plain for a call dispatched before keys were scoped.
            idempotency_key=call.sent_key,
            tool_call_id=call.tool_call_id,
            external_request_id=call.external_request_id,
            attempt=call.attempts,
        )

    @staticmethod
    async def _write(write: Callable[[C], CallView], command: C) -> CallView:
        return await anyio.to_thread.run_sync(write, command)
