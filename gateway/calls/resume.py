"""The runtime side of approvals: run approved calls once, refuse the ones that no longer hold, expire.

Every replica runs this worker; none is special. Claiming an approved call is the store's
compare-and-set (`approved -> dispatching`, with a dispatch lease), so a call approved once is
dispatched once, however many replicas see it. Before claiming, the call is authorized again (DESIGN
§3.4): the current policy over the held full arguments, the principal's standing, the approval's binding
to the exact action. A change refuses the call with a recorded reason instead of running it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import anyio
import anyio.to_thread

from capabilities.contract import Capability
from gateway.calls.actions import is_action_hash, is_contract_hash
from gateway.calls.pipeline import CallPipeline
from gateway.reasons import ReasonCode
from policy.model import CallContext, PolicyInput, Principal
from store.commands import ExpireApproval
from store.model import TERMINAL_STATUSES, ApprovalView, CallView, NotFound, StaleLease, StoreError
from store.ports import Resumption

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why an approved call may not run now: a stable reason code and a sentence."""

    reason: ReasonCode | str
    """A catalogued code, or the current policy's own reason where policy refused it."""
    detail: str
    policy_version: str | None = None
    """The policy in force when it was refused; None for a refusal policy was not asked about."""
    rule_id: str | None = None


@dataclass(frozen=True, slots=True)
class Clearance:
    """An approved call that passed re-authorization: what to dispatch, under which policy version."""

    capability: Capability
    arguments: Mapping[str, Any]
    policy_version: str


def principal_of_record(recorded: Mapping[str, Any]) -> Principal:
    """The principal as recorded with the request (`Principal.to_json()`)."""
    return Principal(
        subject=str(recorded["subject"]),
        tenant=str(recorded.get("tenant", "default")),
        roles=frozenset(recorded.get("roles") or ()),
        scopes=frozenset(recorded.get("scopes") or ()),
        client_id=recorded.get("client_id"),
        groups=frozenset(recorded.get("groups") or ()),
    )


class Resumer:
    """Runs approved calls and expires overdue approvals, one pass per tick or wake-up."""

    def __init__(
        self,
        *,
        store: Resumption,
        pipeline: CallPipeline,
        clock: Callable[[], datetime],
        interval_s: float = 1.0,
        batch: int = 20,
    ) -> None:
        self._store = store
        self._pipeline = pipeline
        self._clock = clock
        self._interval_s = interval_s
        self._batch = batch
        self._wake: anyio.Event | None = None

    def wake(self) -> None:
        """Run a pass now (after a local decision), instead of at the next tick."""
        if self._wake is not None:
            self._wake.set()

    async def run(self) -> None:
        """Pass after pass until cancelled; a failed pass is logged and the next one tries again."""
        while True:
            self._wake = anyio.Event()
            try:
                await self.tick()
            except Exception:  # the top of a background task: log, keep the worker alive
                logger.exception("approval worker pass failed")
            with anyio.move_on_after(self._interval_s):
                await self._wake.wait()

    async def tick(self) -> tuple[int, int]:
        """One pass: expire overdue approvals, then resume approved calls. Returns (expired, resumed)."""
        expired = await anyio.to_thread.run_sync(self._expire_due)
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
        """Re-authorize one approved call, then dispatch it or refuse it; None if another worker did."""
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
                        call.tool_call_id,
                        reason=outcome.reason,
                        detail=outcome.detail,
                        now=now,
                        # The policy in force now, not the request's, even where policy was not
                        # what refused it: the record says under which policy the refusal was made.
                        policy_version=outcome.policy_version or self._pipeline.current_policy().version,
                        rule_id=outcome.rule_id,
                    )
                )
                logger.warning("approved call %s refused: %s", call.tool_call_id, outcome.detail)
                return refused
            claimed = await anyio.to_thread.run_sync(
                lambda: self._store.dispatch_approved(
                    call.tool_call_id,
                    now=now,
                    policy_version=outcome.policy_version,
                    lease_owner=self._pipeline.owner,
                    lease_s=self._pipeline.lease_s(outcome.capability),
                )
            )
        except (StaleLease, NotFound):
            return None  # another replica claimed or refused it first: the approval is used once
        settled = await self._pipeline.dispatch_claimed(outcome.capability, claimed, outcome.arguments)
        if settled.status in TERMINAL_STATUSES and approval_id:
            await anyio.to_thread.run_sync(
                lambda: self._store.release_held_arguments(approval_id, now=self._clock())
            )
        return settled

    def reauthorize(
        self, call: CallView, approval: ApprovalView | None, held: Mapping[str, Any] | None
    ) -> Clearance | Refusal:
        """Authorize the approved call again, now: binding, standing, then the current policy (blocking)."""
        if approval is None or approval.status != "approved":
            return Refusal(ReasonCode.APPROVAL_MISSING, "the call has no granted approval")
        capability = self._pipeline.capability(call.tool_name)
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
        principal = principal_of_record(call.principal or {"subject": call.subject, "tenant": call.tenant})
        if not (
            approval.action_hash == call.action_hash
            and is_action_hash(call.action_hash, capability, arguments, principal)
        ):
            return Refusal(
                ReasonCode.APPROVAL_BINDING_MISMATCH, "the action to run is not the action that was approved"
            )
        if self._revoked(principal.tenant, principal.subject):
            return Refusal(ReasonCode.PRINCIPAL_REVOKED, f"{principal.subject} was revoked after requesting")
        if approval.decided_by and self._revoked(principal.tenant, approval.decided_by):
            return Refusal(ReasonCode.APPROVER_REVOKED, f"{approval.decided_by} was revoked after approving")
        policy = self._pipeline.current_policy()
        earlier = max(self._store.run_call_count(call.run_id, call.tenant) - 1, 0)
        decision = policy.evaluate(
            PolicyInput(
                principal, capability, arguments, CallContext(now=self._clock(), run_call_count=earlier)
            )
        )
        # From here on the current policy decides: its refusal names its version and rule.
        version, rule = decision.policy_version, decision.rule_id
        if decision.effect == "deny":
            return Refusal(
                decision.reason,
                decision.message or f"policy {version} now denies this call",
                version,
                rule,
            )
        if decision.effect == "require_approval":
            needed = decision.approval
            if needed is None or needed.approver_role != approval.approver_role:
                role = needed.approver_role if needed else "?"
                return Refusal(
                    ReasonCode.APPROVAL_INSUFFICIENT,
                    f"policy {version} now needs approval by role {role!r}",
                    version,
                    rule,
                )
            if approval.decided_by == principal.subject and not needed.requester_may_approve:
                return Refusal(
                    ReasonCode.SELF_APPROVAL_FORBIDDEN, "the requester approved their own call", version, rule
                )
        return Clearance(capability, arguments, decision.policy_version)

    def _revoked(self, tenant: str, subject: str) -> bool:
        # `is_revoked` arrives with principal revocation (issue 3); until then nobody is revoked.
        is_revoked = getattr(self._store, "is_revoked", None)
        return bool(is_revoked(tenant, subject)) if is_revoked is not None else False

    def _expire_due(self) -> int:
        # Calls whose user never answered the confirmation round: they will never run.
        expired = len(self._store.expire_confirmations(now=self._clock(), limit=self._batch))
        for approval in self._store.due_approvals(now=self._clock(), limit=self._batch):
            try:
                self._store.expire_approval(ExpireApproval(approval.approval_id, now=self._clock()))
                expired += 1
            except (StaleLease, NotFound):
                continue  # decided or expired by someone else since we looked
        return expired
