"""The runtime side of approvals: run approved calls once, refuse the ones that no longer hold, expire.

Every replica runs this worker; none is special. Claiming an approved call is the store's
compare-and-set (`approved -> dispatching`, with a dispatch lease), so a call approved once is
dispatched once, however many replicas see it. Before claiming, the call is authorized again (DESIGN
§3.4): the current policy over the held full arguments, the principal's standing, the approval's binding
to the exact action. A change refuses the call with a recorded reason instead of running it.

A pass asks the store first, in one look from the event loop (store.agenda), whether an approved call
waits or an approval or confirmation is past its expiry, and reads or writes only for what is due. A
local decision wakes the next pass (`Wake`), whose look sees the decision: it was committed first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Protocol

import anyio
import anyio.to_thread

from capabilities.contract import Capability
from gateway.calls.actions import is_contract_hash
from gateway.calls.authorize import (
    Clearance,
    PolicyLike,
    Reauthorization,
    Refusal,
    principal_of_record,
    reauthorize,
)
from gateway.calls.budgets import store_charges, store_loops
from gateway.calls.dispatch import Dispatcher
from gateway.calls.tracing import ROOT, FirstTrace, links_to, no_first_trace, tracer
from gateway.reasons import ReasonCode
from store.agenda import Due
from store.commands import ExpireApproval
from store.model import (
    TERMINAL_STATUSES,
    ApprovalView,
    ApprovedDenial,
    ApprovedDispatch,
    CallView,
    NotFound,
    PrincipalRecord,
    StaleLease,
    StoreError,
)
from store.ports import Agenda, Resumption

logger = logging.getLogger(__name__)


class Capabilities(Protocol):
    """What resuming needs of the registry: the capability a recorded call would run under now."""

    def in_force(self, tool_name: str, capability_id: str) -> Capability | None: ...


class Resumer:
    """Runs approved calls and expires overdue approvals, one pass per tick (or wake-up, see `Wake`)."""

    def __init__(
        self,
        *,
        store: Resumption,
        agenda: Agenda,
        dispatcher: Dispatcher,
        registry: Capabilities,
        policy: Callable[[], PolicyLike],
        clock: Callable[[], datetime],
        owner: str = "writ-gateway",
        batch: int = 20,
        first_trace: FirstTrace = no_first_trace,
    ) -> None:
        self._first_trace = first_trace
        self._store = store
        self._agenda = agenda
        self._dispatcher = dispatcher
        self._registry = registry
        self._policy = policy
        self._owner = owner
        self._clock = clock
        self._batch = batch

    async def tick(self) -> tuple[int, int]:
        """One pass: expire overdue approvals, then resume approved calls. Returns (expired, resumed)."""
        due = await self._agenda.due_work_async(now=self._clock())
        expired = 0
        if due.expired_approvals or due.expired_confirmations:
            expired = await anyio.to_thread.run_sync(self._expire_due, due)
        approved: list[CallView] = []
        if due.approved:
            approved = await anyio.to_thread.run_sync(
                lambda: self._store.list_calls(status="approved", limit=self._batch)
            )
        resumed = 0
        for call in reversed(approved):  # oldest first
            try:
                if await self.resume(call) is not None:
                    resumed += 1
            except StoreError as exc:
                logger.warning("approved call %s not resumed this pass: %s", call.tool_call_id, exc)
        return expired, resumed

    async def resume(self, call: CallView) -> CallView | None:
        """Re-authorize one approved call, then dispatch it or refuse it; None if another worker did.

        In a trace of its own, linked to the one the call was requested in.
        """
        first = await anyio.to_thread.run_sync(self._first_trace, call.tool_call_id)
        with tracer.start_as_current_span(
            f"resume {call.tool_name}",
            context=ROOT,
            links=links_to(first),
            attributes={"writ.tool_call_id": call.tool_call_id, "writ.capability": call.capability_id},
        ) as span:
            resumed = await self._resume(call)
            span.set_attribute("writ.status", resumed.status if resumed is not None else "taken_elsewhere")
            if resumed is not None and resumed.reason:
                span.set_attribute("writ.reason", resumed.reason)
            return resumed

    async def _resume(self, call: CallView) -> CallView | None:
        approval: ApprovalView | None = None
        held: Mapping[str, Any] | None = None
        approval_id = call.approval_id
        if approval_id:
            approval = await anyio.to_thread.run_sync(lambda: self._store.get_approval(approval_id))
            held = await anyio.to_thread.run_sync(lambda: self._store.held_arguments(approval_id))
        outcome = await anyio.to_thread.run_sync(lambda: self.reauthorize(call, approval, held))
        now = self._clock()
        try:
            if isinstance(outcome, Refusal):
                refused = await anyio.to_thread.run_sync(
                    lambda: self._store.deny_approved(
                        ApprovedDenial(
                            call.tool_call_id,
                            reason=outcome.reason,
                            detail=outcome.detail,
                            now=now,
                            # The policy in force now, not the request's, even where policy was not
                            # what refused it: the record says under which policy the refusal was made.
                            policy_version=outcome.policy_version or self._policy().version,
                            rule_id=outcome.rule_id,
                        )
                    )
                )
                logger.warning("approved call %s refused: %s", call.tool_call_id, outcome.detail)
                return refused
            claimed = await anyio.to_thread.run_sync(
                lambda: self._store.dispatch_approved(
                    ApprovedDispatch(
                        call.tool_call_id,
                        now=now,
                        policy_version=outcome.policy_version,
                        lease_owner=self._owner,
                        lease_s=self._dispatcher.lease_s(outcome.capability),
                        charges=store_charges(outcome.charges),
                        loops=store_loops(outcome.loops),
                    )
                )
            )
        except (StaleLease, NotFound):
            return None  # another replica claimed or refused it first: the approval is used once
        if claimed.status != "dispatching":
            # Refused in the store at execution: a budget with no room left, or a loop found since.
            logger.warning("approved call %s refused at execution: %s", call.tool_call_id, claimed.reason)
            return claimed
        dispatched = await self._dispatcher.dispatch(outcome.capability, claimed, dict(outcome.arguments))
        settled = dispatched.call
        if settled.status in TERMINAL_STATUSES and approval_id:
            await anyio.to_thread.run_sync(
                lambda: self._store.release_held_arguments(approval_id, now=self._clock())
            )
        return settled

    def reauthorize(
        self, call: CallView, approval: ApprovalView | None, held: Mapping[str, Any] | None
    ) -> Clearance | Refusal:
        """Find what the approved call would run now, then authorize it again (blocking)."""
        if approval is None or approval.status != "approved":
            return Refusal(ReasonCode.APPROVAL_MISSING, "the call has no granted approval")
        capability = self._registry.in_force(call.tool_name, call.capability_id)
        if capability is None:
            return Refusal(
                ReasonCode.CAPABILITY_UNAVAILABLE, f"tool {call.tool_name} is no longer registered"
            )
        if (capability.id, capability.version) != (call.capability_id, call.capability_version):
            return Refusal(
                ReasonCode.CAPABILITY_CHANGED,
                f"approved for {call.capability_id}@{call.capability_version}, now {capability.ref}",
            )
        if call.contract_hash is not None and not is_contract_hash(call.contract_hash, capability):
            # Same id and version, another contract (schema, request, backend, key handling, effect):
            # the approver saw an effect this capability no longer performs.
            return Refusal(
                ReasonCode.CAPABILITY_CHANGED,
                f"approved under another contract of {capability.ref} (it changed while the call waited)",
            )
        if held is None and capability.redact:
            return Refusal(
                ReasonCode.ARGUMENTS_UNAVAILABLE, "the full arguments of the approved call are gone"
            )
        arguments = held if held is not None else call.arguments
        principal = principal_of_record(call.principal or PrincipalRecord(call.subject, call.tenant))
        asker = self._store.retry_requested_by(call.tool_call_id)
        return reauthorize(
            Reauthorization(call, capability, principal, arguments, approval, asker),
            policy=self._policy(),
            standing=self._store,
            now=self._clock(),
        )

    def _expire_due(self, due: Due) -> int:
        expired = 0
        if due.expired_confirmations:
            # Calls whose user never answered the confirmation round: they will never run.
            expired += len(self._store.expire_confirmations(now=self._clock(), limit=self._batch))
        if not due.expired_approvals:
            return expired
        for approval in self._store.due_approvals(now=self._clock(), limit=self._batch):
            try:
                self._store.expire_approval(ExpireApproval(approval.approval_id, now=self._clock()))
                expired += 1
            except (StaleLease, NotFound):
                continue  # decided or expired by someone else since we looked
        return expired
