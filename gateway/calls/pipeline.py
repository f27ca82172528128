"""The call pipeline: one path for every tool call, obeying the resume contract (DESIGN §3).

`CallPipeline.call` runs the lifecycle in these steps, one method each:

1. `_prepare`: the capability, the rate limit, the call's ids, key and action hash (`CallIdentity`).
2. `_validate`: arguments that cannot be recorded or fail the schema are refused (`_refuse_invalid`).
3. `_authorize`: policy decides over the full arguments: allow, deny, require_approval; unless it
   denies, it names the budget counters the call draws on.
4. `_intent`, then `store.admit`: the intent with the decision is durable before anything else; in
   the same transaction the budgets are checked and charged, the key is claimed and, for an allowed
   call, `dispatching` is recorded (a call over a budget is recorded refused `budget_exceeded`).
5. `_dispatch_or_join`: the claimant dispatches (`Dispatcher`: executor, then the outcome recorded
   before the client hears it); a call that joined an identical one waits for its recorded state.

Nothing with an effect crosses a boundary before the fact that it is about to is durable in the store;
the store's ledger decides who may dispatch, so replicas and retries never cause a second effect.

A read allowed outright under a derived key (`_read`) has no effect to protect: it runs first, then
its intent, decision and outcome are recorded in one transaction (`store.record_read`, one commit),
before the client hears the answer. Standing and budgets are looked at before it runs and checked
again, and charged, in that transaction; identical reads in flight in this process share one backend
call (`Flights`). A crash between the backend's answer and that commit leaves no record of the read,
and nobody was told its answer.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol, TypeVar

import anyio
import anyio.to_thread

from capabilities.contract import Capability, CapabilityKind, Executor
from gateway.calls.actions import Redactor, action_hash, contract_hash, derived_key, new_id
from gateway.calls.authorize import (
    PolicyLike,
    Reauthorization,
    Refusal,
    decision_record,
    reauthorize,
    record_of,
)
from gateway.calls.budgets import store_charges, store_loops
from gateway.calls.dispatch import Dispatcher
from gateway.calls.flights import Flights
from gateway.calls.rate_limits import RateLimiter
from gateway.calls.run_ids import run_of
from gateway.calls.tracing import current_trace_context, tracer
from gateway.calls.validation import MAX_ARGUMENT_BYTES, InputSchemas, oversized, unrecordable
from gateway.clock import Clock, system_clock
from gateway.errors import Refused, UnknownTool
from gateway.reasons import ReasonCode
from policy import POLICY_ERROR
from policy.cel import ExpressionError
from policy.model import ApprovalRequirement, CallContext, Decision, PolicyInput, Principal
from store.model import (
    IN_FLIGHT_STATUSES,
    Admission,
    Breach,
    CallIdentity,
    CallRequest,
    CallView,
    Charge,
    ConfirmationAnswer,
    ConfirmationMismatch,
    KeySource,
    LoopHit,
    LoopKey,
    NotFound,
    RefusalRequest,
    RetryLink,
    StaleLease,
)
from store.ports import CallLedger

logger = logging.getLogger(__name__)


_T = TypeVar("_T")

TOOL_NAME = re.compile(r"[A-Za-z0-9._-]{1,128}")
"""What MCP (2025-11-25, SEP-986) says a tool name should be."""


class RegistryLike(Protocol):
    def get(self, tool_name: str) -> Capability | None: ...

    def prompt(self, name: str) -> Capability | None: ...

    def resource_capability(self, uri: str) -> Capability | None: ...

    def in_force(self, tool_name: str, capability_id: str) -> Capability | None: ...

    def executor(self, capability: Capability) -> Executor: ...

    def capabilities(self) -> Sequence[Capability]: ...


@dataclass(frozen=True, slots=True)
class CallInput:
    """One tools/call as the MCP edge hands it in: who, which tool, which arguments, which key.

    A relayed resource read or prompt get is a call too (`kind`): `tool_name` is then the prompt's
    name, or the resource's URI, which is also the `uri` argument.
    """

    principal: Principal
    tool_name: str
    arguments: Mapping[str, Any]
    idempotency_key: str | None = None
    run_id: str | None = None
    session_id: str | None = None
    """The MCP session the call came in (2025-11-25 streamable HTTP, or a stdio process): it groups
    the calls of a client that names no run; None where the protocol has no session (2026-07-28)."""
    correlation_id: str | None = None
    can_confirm: bool = False
    """The client can ask its user to confirm in an input-required round (needed by `confirm` tools)."""
    kind: CapabilityKind = "tool"
    retry: Retrying | None = None
    """Set when a person re-runs a failed call (`gateway.calls.retries`), not by any client."""
    asks_in_rounds: bool = False
    """Its client answers what the upstream asks in input-required rounds of this very call, so an
    identical read in flight is not joined to it, nor it to one (that one's client could not answer)."""


@dataclass(frozen=True, slots=True)
class Retrying:
    """A retry's link to the failed call, and what it keeps of it: its run and where its key came from."""

    link: RetryLink
    run_id: str | None
    key_source: KeySource


@dataclass(frozen=True, slots=True)
class ConfirmInput:
    """The user's answer to a pending confirmation, as the client's retry carries it."""

    principal: Principal
    tool_name: str
    arguments: Mapping[str, Any]
    tool_call_id: str
    confirmation_id: str
    action: Literal["accept", "decline", "cancel"]


@dataclass(frozen=True, slots=True)
class CallReport:
    """What the pipeline did, for the edge to shape into a result."""

    kind: Literal["new", "joined", "conflict", "invalid_arguments"]
    call: CallView
    capability: Capability
    validation_errors: tuple[str, ...] = ()
    existing: CallView | None = None
    expires_at: datetime | None = field(default=None)
    recorded: bool = True
    """False: the call was dispatched and its outcome could not be recorded; `call` is the record
    from before (`dispatching`). The edges tell the client `result_unknown`, never what was seen."""
    breach: Breach | None = None
    """The budget the call would have passed, when it was refused `budget_exceeded`."""
    loop: LoopHit | None = None
    """The loop the call belongs to, when it was refused `loop_detected`."""

    @property
    def reported(self) -> CallView:
        """The call as the client hears of it: an outcome that could not be recorded is unknown."""
        return self.call if self.recorded else replace(self.call, status="result_unknown")


@dataclass(frozen=True, slots=True)
class _Prepared:
    """A call named and hashed, before it is validated: what every later step reads."""

    inp: CallInput
    capability: Capability
    arguments: dict[str, Any]
    """The full arguments (what the executor gets and policy sees); the identity holds the stored ones."""
    identity: CallIdentity
    policy: PolicyLike
    """The policy in force when the call arrived, read once so every step sees the same version."""
    unfit: tuple[str, ...]

    @property
    def summary(self) -> str:
        return self.capability.summarize(self.identity.arguments)

    def refusal(self, reason: ReasonCode | str, detail: str, policy_version: str) -> RefusalRequest:
        return RefusalRequest(self.identity, reason, detail, policy_version, self.summary)


class CallPipeline:
    """Runs calls; built once by the composition root with the store, registry and policy it uses."""

    def __init__(
        self,
        *,
        store: CallLedger,
        registry: RegistryLike,
        policy: Callable[[], PolicyLike],
        redactor: Redactor,
        dispatcher: Dispatcher | None = None,
        clock: Clock = system_clock,
        join_wait_s: float = 10.0,
        owner: str = "writ-gateway",
        notify_approvals: bool = False,
        confirmation_ttl_s: float = 600.0,
        rate_limiter: RateLimiter | None = None,
        max_argument_bytes: int = MAX_ARGUMENT_BYTES,
    ) -> None:
        self._rate_limiter = rate_limiter
        self._max_argument_bytes = max_argument_bytes
        self._store = store
        self._registry = registry
        self._policy = policy
        self._redactor = redactor
        self._clock = clock
        self._join_wait_s = join_wait_s
        self._owner = owner
        # The composition root shares one dispatcher with the workers; a test may let us make our own.
        self._dispatcher = dispatcher or Dispatcher(
            store=store, registry=registry, redactor=redactor, clock=clock
        )
        self._notify_approvals = notify_approvals
        self._confirmation_ttl_s = confirmation_ttl_s
        self._schemas = InputSchemas()
        self._reads: Flights[CallReport] = Flights()

    @property
    def redactor(self) -> Redactor:
        """How this pipeline stores redacted values (what else a call records follows it too)."""
        return self._redactor

    def prepare(self) -> None:
        """Check every capability's input schema once, after the registry has discovered them all.

        Raises:
            ConfigurationError: a capability's input schema is not a valid JSON Schema, or a rate
                limit names a tool no capability has.
        """
        if self._rate_limiter is not None:
            self._rate_limiter.check_tools(c.tool_name for c in self._registry.capabilities())
        for capability in self._registry.capabilities():
            self._schemas.check(capability)
            if not TOOL_NAME.fullmatch(capability.tool_name):
                # Often an upstream's own name, passed through: clients may refuse the whole list.
                logger.warning(
                    "%s: tool name %r is not 1 to 128 of A-Z a-z 0-9 _ - . (MCP tool names); some "
                    "clients refuse it: rename it (rename: for MCP backends, tool: for others)",
                    capability.ref,
                    capability.tool_name,
                )

    async def call(self, inp: CallInput) -> CallReport:
        """Admit, decide and (when allowed and ours to do) dispatch one call: DESIGN §3, step by step.

        Raises:
            UnknownTool: no capability has this tool name.
            RateLimited: the principal called too often; nothing was recorded.
        """
        # On its way to a commit from here: the store's group writer may hold a transaction back a
        # moment for it (store.coming), never for a call that is alone.
        with self._store.coming(1) as coming:
            call = await self._prepare(inp)
            if errors := self._validate(call):
                return await self._refuse_invalid(call, errors)
            decision, charges, loops = await self._authorize(call)
            request = self._intent(call, decision, charges, loops)
            if isinstance(request, RefusalRequest):
                return CallReport("new", await self._run(self._store.refuse, request), call.capability)
            if _one_commit(request) and inp.retry is None:
                return await self._read(call, request)
            coming.also(1)  # the outcome, if it dispatches
            admission = await self._store.admit_async(request)
            return await self._dispatch_or_join(call, request, admission)

    async def _read(self, call: _Prepared, request: CallRequest) -> CallReport:
        """Run a read allowed outright, then record it whole in one commit; or join an identical one
        running in this process. A revoked principal or a spent budget takes the path of every other
        call (`admit`), which records the refusal."""

        async def run() -> CallReport:
            if not await self._store.admissible_read_async(request):
                return await self._dispatch_or_join(call, request, await self._store.admit_async(request))
            ran = await self._dispatcher.run_read(call.capability, request, call.arguments)
            admission = await self._store.record_read_async(ran)
            return CallReport(
                "new", admission.call, call.capability, breach=admission.breach, loop=admission.loop
            )

        who = request.identity
        key: Hashable = (who.tenant, who.subject, who.idempotency_key)
        report, joined = await self._reads.run(object() if call.inp.asks_in_rounds else key, run)
        if not joined or report.kind != "new":
            return report
        return CallReport("joined", report.call, call.capability, breach=report.breach, loop=report.loop)

    async def _prepare(self, inp: CallInput) -> _Prepared:
        """Find the capability, take the rate limit, and name the call: ids, key, action hash."""
        capability = self._resolve(inp)
        if capability is None:
            raise UnknownTool(inp.tool_name)
        principal = inp.principal
        if self._rate_limiter is not None and (buckets := self._rate_limiter.buckets(principal, capability)):
            # First, before anything is hashed, checked or recorded: a flood costs the log nothing.
            # Only a call that draws on a bucket crosses to a thread (the store): with limits off, a
            # hand-off that did nothing cost each call about 0.1 ms of CPU, more on a busy machine.
            await anyio.to_thread.run_sync(self._rate_limiter.take, buckets, self._clock())
        # Arguments that are not JSON (NaN, a lone surrogate, absurd nesting) cannot be hashed or stored:
        # the refusal records a copy with stand-ins for the offending values, and nothing runs.
        unfit, recordable = unrecordable(inp.arguments)
        arguments = recordable if unfit else dict(inp.arguments)
        if too_large := oversized(arguments, self._max_argument_bytes):
            unfit = [too_large, *unfit]
        now = self._clock()
        action = action_hash(capability, arguments, principal)
        key_source: KeySource
        key, key_source = (
            (inp.idempotency_key, "client")
            if inp.idempotency_key
            else (derived_key(principal, action, inp.run_id), "derived")
        )
        run_id, origin = run_of(principal, inp.run_id, inp.session_id)
        if inp.retry is not None:
            # In the failed call's run (a stopped run refuses it), under the key the retry service chose.
            key_source, run_id, origin = inp.retry.key_source, inp.retry.run_id, None
        tool_call_id = new_id("tc")
        stored_arguments = self._redactor.redact(capability, arguments)
        # What a refusal and an admission record alike: who asked for which action, under which key.
        identity = CallIdentity(
            tool_call_id=tool_call_id,
            run_id=run_id,
            run_origin=origin,
            client_run_id=inp.run_id or None,
            tenant=principal.tenant,
            subject=principal.subject,
            principal=record_of(principal),
            tool_name=capability.tool_name,
            capability_id=capability.id,
            capability_version=capability.version,
            arguments=stored_arguments,
            action_hash=action,
            contract_hash=contract_hash(capability),
            idempotency_key=key,
            key_source=key_source,
            correlation_id=inp.correlation_id or tool_call_id,
            now=now,
            trace_context=current_trace_context(),
            retry=inp.retry.link if inp.retry is not None else None,
        )
        return _Prepared(inp, capability, arguments, identity, self._policy(), tuple(unfit))

    def _resolve(self, inp: CallInput) -> Capability | None:
        """The capability the call names, of the kind it asks for (a tool is never a prompt)."""
        if inp.kind == "prompt":
            return self._registry.prompt(inp.tool_name)
        if inp.kind == "resource":
            return self._registry.resource_capability(inp.tool_name)
        return self._registry.get(inp.tool_name)

    def _validate(self, call: _Prepared) -> tuple[str, ...]:
        """Why the arguments cannot be run (unrecordable, too large, against the schema); empty if fine."""
        return call.unfit or tuple(self._schemas.errors(call.capability, call.arguments))

    async def _refuse_invalid(self, call: _Prepared, errors: tuple[str, ...]) -> CallReport:
        """Record the refusal of invalid arguments: requested, then denied; no key is claimed."""
        refusal = call.refusal(ReasonCode.INVALID_ARGUMENTS, "; ".join(errors), call.policy.version)
        refused = await self._run(self._store.refuse, refusal)
        return CallReport("invalid_arguments", refused, call.capability, validation_errors=errors)

    async def _authorize(self, call: _Prepared) -> tuple[Decision, tuple[Charge, ...], tuple[LoopKey, ...]]:
        """The policy's decision over the full arguments, with the calls made earlier in the run, and
        the budget counters and loop patterns the call counts in unless it is denied anyway."""
        who = call.identity
        with tracer.start_as_current_span(f"authorize {who.tool_name}") as span:
            counted = who.run_id and call.policy.reads_run_call_count
            run_count = await self._run(self._store.run_call_count, who.run_id, who.tenant) if counted else 0
            context = CallContext(now=who.now, run_call_count=run_count)
            inp = PolicyInput(call.inp.principal, call.capability, call.arguments, context)
            decision = call.policy.evaluate(inp)
            if decision.effect != "deny":
                try:
                    charges = store_charges(call.policy.charges(inp, who.run_id))
                except ExpressionError as exc:
                    # An amount that cannot be counted denies the call: a budget is never skipped.
                    decision = Decision(
                        "deny", POLICY_ERROR, decision.policy_version, exc.rule_id, message=str(exc)
                    )
            span.set_attributes(
                {
                    "writ.decision": decision.effect,
                    "writ.policy_version": decision.policy_version,
                    **({"writ.reason": decision.reason} if decision.reason else {}),
                    **({"writ.rule": decision.rule_id} if decision.rule_id else {}),
                }
            )
        if decision.effect == "deny":
            return decision, (), ()
        return decision, charges, store_loops(call.policy.loop_marks(inp))

    def _intent(
        self,
        call: _Prepared,
        decision: Decision,
        charges: tuple[Charge, ...] = (),
        loops: tuple[LoopKey, ...] = (),
    ) -> CallRequest | RefusalRequest:
        """What to record before anything happens: the intent, or the refusal of a call nobody can confirm."""
        capability, now = call.capability, call.identity.now
        approval_id = expires_at = None
        over_budget = None
        if decision.effect == "allow" and capability.effect != "confirm":
            # Should a budget saying require_approval be passed, the store records this instead.
            over_budget = _over_budget(decision, charges)
        asked = over_budget or decision
        if asked.effect == "require_approval" and asked.approval is not None:
            approval_id = new_id("ap")
            expires_at = now + timedelta(seconds=asked.approval.expires_in_s)
        confirmation_id = confirm_by = None
        if decision.effect == "allow" and capability.effect == "confirm":
            if not call.inp.can_confirm:
                # Nobody can be asked, so the effect cannot happen: refused, recorded, never claimed.
                detail = (
                    f"{capability.ref} runs only after the user confirms it in the client; this client "
                    "cannot be asked (it needs MCP 2026-07-28 input-required rounds and form elicitation)"
                )
                return call.refusal(ReasonCode.CONFIRMATION_UNAVAILABLE, detail, decision.policy_version)
            confirmation_id = new_id("cf")
            confirm_by = now + timedelta(seconds=self._confirmation_ttl_s)
        stored_arguments = call.identity.arguments
        return CallRequest(
            call.identity,
            dedupe_window_s=_dedupe_window(capability),
            decision=decision_record(decision),
            policy_version=decision.policy_version,
            effect_class=capability.effect,
            summary=call.summary,
            external_request_id=new_id("req"),
            approval_id=approval_id,
            approval_expires_at=expires_at,
            lease_owner=self._owner,
            lease_s=self._dispatcher.lease_s(capability),
            held_arguments=call.arguments if approval_id else None,
            notification=(
                _approval_notice(
                    capability, call.inp.principal, asked, approval_id, expires_at, stored_arguments
                )
                if approval_id and expires_at and self._notify_approvals
                else None
            ),
            confirmation_id=confirmation_id,
            confirmation_expires_at=confirm_by,
            charges=charges,
            loops=loops,
            over_budget=decision_record(over_budget) if over_budget else None,
        )

    async def _dispatch_or_join(
        self, call: _Prepared, request: CallRequest, admission: Admission
    ) -> CallReport:
        """Dispatch a call whose key we claimed (its outcome is recorded before we return); or wait,
        bounded, for the call we joined to settle."""
        settled, recorded = admission.call, True
        if admission.owns_dispatch:
            dispatched = await self._dispatcher.dispatch(call.capability, settled, call.arguments)
            settled, recorded = dispatched.call, dispatched.recorded
        elif admission.kind == "joined" and settled.status in IN_FLIGHT_STATUSES:
            settled = await self._await_settled(settled)
        return CallReport(
            admission.kind,
            settled,
            call.capability,
            existing=admission.existing,
            expires_at=request.approval_expires_at,
            recorded=recorded,
            breach=admission.breach,
            loop=admission.loop,
        )

    @staticmethod
    async def _run(write: Callable[..., _T], *args: Any) -> _T:
        # The store is blocking: every crossing runs in a worker thread.
        return await anyio.to_thread.run_sync(write, *args)

    async def confirm(self, inp: ConfirmInput) -> CallReport:
        """Apply the user's answer to a pending confirmation: accept dispatches the call once.

        The answer is consumed by the store's compare-and-set on the call awaiting exactly this
        confirmation of exactly this action; policy and the principal's standing are checked again first.

        Raises:
            UnknownTool: no capability has this tool name.
            RateLimited: the principal called too often; nothing was recorded.
            Refused: the confirmation is used, expired, bound elsewhere, or no longer allowed.
        """
        capability = self._registry.get(inp.tool_name)
        if capability is None:
            raise UnknownTool(inp.tool_name)
        principal, arguments = inp.principal, dict(inp.arguments)
        unfit, _ = unrecordable(arguments)
        if unfit:  # never the arguments the confirmation was asked for: those were recorded
            raise Refused(ReasonCode.INVALID_ARGUMENTS, "; ".join(unfit))
        action = action_hash(capability, arguments, principal)
        if inp.action == "accept":
            refusal = await self._still_allowed(capability, principal, arguments, inp.tool_call_id)
            if refusal is not None:
                raise Refused(refusal, f"the call may no longer run ({refusal})")
        try:
            call = await anyio.to_thread.run_sync(
                lambda: self._store.answer_confirmation(
                    ConfirmationAnswer(
                        inp.tool_call_id,
                        confirmation_id=inp.confirmation_id,
                        action_hash=action,
                        action=inp.action,
                        answered_by=principal.subject,
                        now=self._clock(),
                        lease_owner=self._owner,
                        lease_s=self._dispatcher.lease_s(capability),
                    )
                )
            )
        except ConfirmationMismatch as exc:
            raise Refused(ReasonCode.CONFIRMATION_MISMATCH, str(exc)) from exc
        except (StaleLease, NotFound) as exc:
            raise Refused(ReasonCode.CONFIRMATION_USED, str(exc)) from exc
        if call.status == "dispatching":
            dispatched = await self._dispatcher.dispatch(capability, call, arguments)
            return CallReport("new", dispatched.call, capability, recorded=dispatched.recorded)
        return CallReport("new", call, capability)

    async def _still_allowed(
        self, capability: Capability, principal: Principal, arguments: Mapping[str, Any], tool_call_id: str
    ) -> ReasonCode | str | None:
        """None if the call is still allowed outright now; else the reason it is not."""
        call = await anyio.to_thread.run_sync(
            lambda: self._store.get_call(tool_call_id, tenant=principal.tenant)
        )
        if call is None:
            return ReasonCode.CONFIRMATION_MISMATCH
        again = Reauthorization(call, capability, principal, arguments)
        outcome = await anyio.to_thread.run_sync(
            lambda: reauthorize(again, policy=self._policy(), standing=self._store, now=self._clock())
        )
        return outcome.reason if isinstance(outcome, Refusal) else None

    async def _await_settled(self, call: CallView) -> CallView:
        """A joiner waits, bounded, for the dispatch it joined to settle, reading the shared store."""
        delay = 0.02
        with anyio.move_on_after(self._join_wait_s):
            while call.status in ("requested", "dispatching"):
                await anyio.sleep(delay)
                delay = min(delay * 2, 0.5)
                latest = await anyio.to_thread.run_sync(self._store.get_call, call.tool_call_id)
                call = latest or call
        return call


def _approval_notice(
    capability: Capability,
    principal: Principal,
    decision: Decision,
    approval_id: str,
    expires_at: datetime,
    stored_arguments: Mapping[str, Any],
) -> dict[str, Any]:
    """What reviewers are told of a pending approval: the exact effect, with redactions as stored."""
    return {
        "type": "approval.required",
        "approvalId": approval_id,
        "tenant": principal.tenant,
        "requester": principal.subject,
        "capability": capability.ref,
        "summary": capability.summarize(stored_arguments),
        "arguments": dict(stored_arguments),
        "rule": decision.rule_id,
        "reason": decision.reason,
        "approverRole": decision.approval.approver_role if decision.approval else None,
        "expiresAt": expires_at.isoformat(),
        "policyVersion": decision.policy_version,
    }


def _over_budget(decision: Decision, charges: tuple[Charge, ...]) -> Decision | None:
    """The decision to record if the call passes a budget whose `on_exceed` is `require_approval`: the
    first such budget's approver decides (the store uses it only if every budget passed says so)."""
    for charge in charges:
        if (need := charge.approval) is not None:
            return Decision(
                "require_approval",
                ReasonCode.BUDGET_EXCEEDED,
                decision.policy_version,
                charge.budget_id,
                ApprovalRequirement(need.approver_role, need.expires_in_s, need.requester_may_approve),
                message=f"budget {charge.budget_id!r} is used up: a person decides whether this call runs",
            )
    return None


def _one_commit(request: CallRequest) -> bool:
    """Whether a call is recorded once, after it ran: a read allowed outright, under a derived key.

    Writes, reads awaiting approval and reads under a client's idempotency key (whose recorded state
    the key promises to every later call that names it) are admitted before they run. A read that a
    budget or a loop rule counts is recorded once too: its limit is looked at before the backend is
    asked and checked again, and charged, in that one commit under the head lock; a read that lost the
    race there is recorded refused and its answer withheld (it had no effect, so nothing is lost).
    """
    return (
        request.effect_class == "read"
        and request.decision.effect == "allow"
        and request.approval_id is None
        and request.confirmation_id is None
        and request.identity.key_source == "derived"
    )


def _dedupe_window(capability: Capability) -> int:
    """How long a completed identical call is joined: never for reads, whose answers go stale."""
    return 0 if capability.effect == "read" else capability.dedupe_window_s
