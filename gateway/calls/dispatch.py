"""Dispatch: execute one call this process holds the lease of, and record what was observed.

The half of the resume contract that crosses the boundary to the backend: check the lease still
covers the whole bounded dispatch, call the executor (shielded, so a departing client cannot leave
the outcome unrecorded), and record the outcome under the fencing token. Used for calls allowed
outright, approved calls, confirmed calls and reconciliation retries alike.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

import anyio
import anyio.to_thread
from opentelemetry.trace import SpanKind, StatusCode

from capabilities.contract import Capability, Executor, Invocation, Outcome, OutcomeKind
from gateway.calls.actions import Redactor
from gateway.calls.faults import NO_FAULTS, FaultPoints
from gateway.calls.tracing import tracer
from store.coming import away
from store.commands import RecordContradiction, RecordOutcome
from store.model import CallRequest, CallView, OutcomeRecord, ReadRecord, StaleLease, StoreError, Unavailable
from store.ports import Outcomes

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Dispatched:
    """What one dispatch left behind."""

    call: CallView
    """The call as recorded; when `recorded` is False, as it was before the executor ran."""
    recorded: bool = True
    """False: the outcome could not be stored (the database was gone or refused the write). The
    effect may have happened; nobody may be told what was observed, and the call stays `dispatching`
    under our lease until recovery marks it unknown and reconciliation settles it."""


class Executors(Protocol):
    """What dispatch needs of the registry: the executor that serves a capability."""

    def executor(self, capability: Capability) -> Executor: ...


class Dispatcher:
    """Runs executors under dispatch leases; one per process, shared by every path that dispatches."""

    def __init__(
        self,
        *,
        store: Outcomes,
        registry: Executors,
        redactor: Redactor,
        clock: Callable[[], datetime],
        executor_grace_s: float = 5.0,
        lease_margin_s: float = 10.0,
        faults: FaultPoints = NO_FAULTS,
    ) -> None:
        self._store = store
        self._registry = registry
        self._redactor = redactor
        self._clock = clock
        self._executor_grace_s = executor_grace_s
        self._lease_margin_s = lease_margin_s
        self._faults = faults

    def guard_s(self, capability: Capability) -> float:
        """The longest one dispatch may take: the capability's timeout plus the executor's grace."""
        return capability.timeout_s + self._executor_grace_s

    def lease_s(self, capability: Capability) -> float:
        """How long a dispatch lease lasts: the longest dispatch plus a margin for recording it."""
        return self.guard_s(capability) + self._lease_margin_s

    def commit_deadline(
        self, capability: Capability, sent_at: datetime, lease_expires_at: datetime | None
    ) -> datetime:
        """When a dispatch recorded at `sent_at` under a lease ending `lease_expires_at` can no longer land.

        The dispatcher sends only while the whole bounded dispatch still fits its lease, so the request
        left no later than `lease_expires_at - guard_s` (up to `lease_margin_s` after its record); the
        backend may act on it for `horizon_s` after that. Counting from the record alone would end the
        horizon early by however long the dispatcher paused between recording and sending.
        """
        latest_send = (
            lease_expires_at - timedelta(seconds=self.guard_s(capability)) if lease_expires_at else sent_at
        )
        return max(sent_at, latest_send) + timedelta(seconds=capability.horizon_s)

    async def dispatch(self, capability: Capability, call: CallView, arguments: dict[str, Any]) -> Dispatched:
        """Execute a call this process holds the dispatch lease of, and record what it observed."""
        invocation = Invocation(
            capability=capability,
            arguments=arguments,
            # As its dispatch record says it is sent: scoped to the principal (store.keys).
            idempotency_key=call.sent_key,
            tool_call_id=call.tool_call_id,
            external_request_id=call.external_request_id,
            attempt=max(call.attempts, 1),
            # The call was last updated by its dispatch record, under the lease it is sent in.
            commit_deadline=self.commit_deadline(capability, call.updated_at, call.lease_expires_at),
        )
        self._faults.reach("after_dispatching_commit")
        # The effect and its record are one unit: a client that goes away must not leave the call
        # `dispatching` with its outcome unrecorded.
        with anyio.CancelScope(shield=True):
            if self._lease_covers_dispatch(capability, call):
                with away(capability.ref):  # the group writer waits for it only while it is due back
                    outcome = await self._execute(capability, invocation)
                self._faults.reach("after_execute")
                if invocation.attempt > 1:
                    outcome = answer_to_resend(outcome, invocation.attempt)
            else:
                # Paused (GC, SIGSTOP, a slow disk) until too little lease is left: another replica may
                # already be settling this call, so sending now could race it. Nothing was sent (by
                # this attempt: a re-send's earlier attempts may have acted, so it stays unknown).
                outcome = answer_to_resend(
                    Outcome(
                        kind="failed",
                        error="lease_expired_before_dispatch",
                        detail="the dispatch lease ran out before the request was sent; nothing was sent",
                        evidence={"sent": False},
                    ),
                    invocation.attempt,
                )
            settled = await self._record(
                call, outcome, lambda data: self._redactor.withhold_echoes(capability, arguments, data)
            )
            self._faults.reach("after_outcome_commit")
        # Returned after the scope, not inside it: a cancel scope may swallow an exception (this
        # unshared, deadline-free one never does), so a `return` inside leaves a path returning None.
        return settled

    async def run_read(
        self, capability: Capability, request: CallRequest, arguments: dict[str, Any]
    ) -> ReadRecord:
        """Run a read allowed outright before anything of it is recorded; the caller records it whole.

        A read has no effect to protect, so nothing is made durable before it is sent: a crash before
        `Store.record_read` commits leaves no trace of it, and its answer was never told.
        """
        who = request.identity
        sent_at = self._clock()
        invocation = Invocation(
            capability=capability,
            arguments=arguments,
            idempotency_key=who.sent_key,  # what `record_read` records it was sent under
            tool_call_id=who.tool_call_id,
            external_request_id=request.external_request_id,
            attempt=1,
            commit_deadline=sent_at + timedelta(seconds=self.guard_s(capability) + capability.horizon_s),
        )
        with away(capability.ref):
            outcome = await self._execute(capability, invocation)
        record = self._observed(
            outcome, lambda data: self._redactor.withhold_echoes(capability, arguments, data)
        )
        return ReadRecord(request, record, observed_at=self._clock())

    def _lease_covers_dispatch(self, capability: Capability, call: CallView) -> bool:
        # Checked locally right before sending: the whole dispatch must fit in what is left of the
        # lease, or recovery could declare it unknown and reconciliation look before it lands.
        if call.lease_expires_at is None:
            return True
        return self._clock() + timedelta(seconds=self.guard_s(capability)) <= call.lease_expires_at

    async def _contradict(self, call: CallView, record: OutcomeRecord) -> CallView | None:
        evidence = {**record.evidence, "attempt": call.attempts, "result": record.result}
        now = self._clock()
        try:
            return await anyio.to_thread.run_sync(
                lambda: self._store.record_contradiction(
                    RecordContradiction(
                        call.tool_call_id,
                        source="late_response",
                        verdict="confirmed_success",
                        evidence=evidence,
                        detail="the backend answered with success after the call was settled",
                        now=now,
                    )
                )
            )
        except StoreError as exc:
            logger.error("contradiction of %s not recorded: %s", call.tool_call_id, exc)
            return None

    async def _record(self, call: CallView, outcome: Outcome, withhold: Callable[[Any], Any]) -> Dispatched:
        """Record the outcome under our fencing token; if we were fenced, report the recorded state.

        What the backend said passes `withhold` first: an echo of a redacted argument never reaches the
        log, nor the client's answer, which is read from the record.
        """
        record = self._observed(outcome, withhold)
        token, now = call.lease_token, self._clock()
        try:
            recorded = await self._store.record_outcome_async(
                RecordOutcome(call.tool_call_id, record, token=token, now=now)
            )
            return Dispatched(recorded)
        except StaleLease as exc:
            # Our lease ran out and another worker settled the call meanwhile; its record stands.
            logger.warning("outcome of %s not recorded (%s): %s", call.tool_call_id, outcome.kind, exc)
            if outcome.kind == "completed":
                # The backend did act. If the call was settled as failed meanwhile, that verdict is
                # wrong: recorded beside it and escalated. (A late error proves less: an earlier
                # attempt's refusal says nothing of a later re-send's effect.)
                contradicted = await self._contradict(call, record)
                if contradicted is not None:
                    return Dispatched(contradicted)
            latest = await anyio.to_thread.run_sync(self._store.get_call, call.tool_call_id)
            return Dispatched(latest or call)
        except StoreError as exc:
            # The backend may have acted and its outcome could not be written (the database is gone,
            # or refused the write): what we saw is not durable, so it must not be told. The call stays
            # `dispatching` under our lease; once the lease expires, whichever replica reaches the
            # database marks it unknown and reconciles it.
            logger.error(
                "outcome of %s (%s) not recorded; it will be reconciled: %s",
                call.tool_call_id,
                outcome.kind,
                exc,
                exc_info=not isinstance(exc, Unavailable),
            )
            return Dispatched(call, recorded=False)

    @staticmethod
    def _observed(outcome: Outcome, withhold: Callable[[Any], Any]) -> OutcomeRecord:
        return OutcomeRecord(
            kind=outcome.kind,
            result=withhold(outcome.result.to_json()) if outcome.result is not None else None,
            error=outcome.error,
            detail=withhold(outcome.detail) if outcome.detail is not None else None,
            external_request_id=outcome.external_request_id,
            evidence=withhold(dict(outcome.evidence)),
        )

    async def _execute(self, capability: Capability, invocation: Invocation) -> Outcome:
        # The backend call: its trace context travels to HTTP backends in headers, to MCP upstreams in
        # `_meta` (the executors inject the current context).
        with tracer.start_as_current_span(
            f"dispatch {capability.tool_name}",
            kind=SpanKind.CLIENT,
            attributes={
                "writ.capability": capability.ref,
                "writ.tool_call_id": invocation.tool_call_id,
                "writ.attempt": invocation.attempt,
            },
        ) as span:
            outcome = await self._execute_bounded(capability, invocation)
            span.set_attribute("writ.outcome", outcome.kind)
            if outcome.kind != "completed":
                span.set_attribute("error.type", outcome.error or outcome.kind)
                span.set_status(StatusCode.ERROR, outcome.error or outcome.kind)
            return outcome

    async def _execute_bounded(self, capability: Capability, invocation: Invocation) -> Outcome:
        executor = self._registry.executor(capability)
        # Executors enforce their own timeouts; this bound only catches an executor that does not.
        guard_s = self.guard_s(capability)
        try:
            with anyio.fail_after(guard_s):
                return await executor.execute(invocation)
        except TimeoutError:
            reason, detail = "executor_timeout", f"no outcome from the executor within {guard_s:.0f}s"
        except Exception as exc:  # an executor bug must still leave a recorded, honest outcome
            logger.exception("executor for %s raised", capability.ref)
            reason, detail = "executor_error", type(exc).__name__
        kind: OutcomeKind = "failed" if capability.effect == "read" else "unknown"
        return Outcome(kind=kind, error=reason, detail=detail)


def answer_to_resend(outcome: Outcome, attempt: int) -> Outcome:
    """What the answer to attempt `attempt` says of the call: for a re-send (attempt > 1) under the
    same key, only a success settles it; any other answer leaves it `unknown`, kept as evidence.

    A refusal of a re-send says nothing of the attempts before it, any of which may have taken effect
    or still be running: a backend that deduplicates on the key answers 409 while the first request
    with it is in flight (Stripe's "a request with this key is in progress"), and commits that one.
    """
    if attempt <= 1 or outcome.kind != "failed":
        return outcome
    evidence: dict[str, Any] = {**outcome.evidence, "resend_attempt": attempt, "resend_answer": "failed"}
    if outcome.result is not None:
        evidence["answer"] = outcome.result.to_json()
    return Outcome(
        kind="unknown",
        error=outcome.error,
        detail=outcome.detail,
        external_request_id=outcome.external_request_id,
        evidence=evidence,
    )
