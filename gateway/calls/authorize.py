"""Authorization at execution time: the decision as the store records it, and re-authorization.

Every path that runs a call later than it was requested (a confirmed call, an approved call) goes
through `reauthorize` (DESIGN §3.4): the approval's binding to the exact action, the principal's
standing, then the current policy. A change refuses the call with a reason code.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from capabilities.contract import Capability
from gateway.calls.actions import is_action_hash
from gateway.reasons import ReasonCode
from policy import POLICY_ERROR
from policy.budgets import BudgetCharge
from policy.cel import ExpressionError
from policy.loops import LoopMark
from policy.model import CallContext, Decision, PolicyInput, Principal
from store.model import ApprovalNeed, ApprovalView, CallView, DecisionRecord, PrincipalRecord


class PolicyLike(Protocol):
    @property
    def version(self) -> str: ...

    @property
    def reads_run_call_count(self) -> bool: ...

    def evaluate(self, inp: PolicyInput) -> Decision: ...

    def charges(self, inp: PolicyInput, run_id: str | None) -> tuple[BudgetCharge, ...]: ...

    def loop_marks(self, inp: PolicyInput) -> tuple[LoopMark, ...]: ...

    def may_list(self, principal: Principal, capability: Capability, uri: str | None = None) -> bool: ...


class AuthorizationReads(Protocol):
    """What re-authorization reads of the store: revocations and how many calls a run has made."""

    def is_revoked(self, tenant: str, subject: str) -> bool: ...

    def run_call_count(self, run_id: str, tenant: str) -> int: ...


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a call may not run now: a stable reason code and a sentence."""

    reason: ReasonCode | str
    """A catalogued code, or the current policy's own reason where policy refused it."""
    detail: str
    policy_version: str | None = None
    """The policy in force when it was refused; None for a refusal policy was not asked about."""
    rule_id: str | None = None


@dataclass(frozen=True, slots=True)
class Clearance:
    """A call that passed re-authorization: what to dispatch, under which policy version."""

    capability: Capability
    arguments: Mapping[str, Any]
    policy_version: str
    charges: tuple[BudgetCharge, ...] = ()
    """The budget counters the current policy says the call draws on now (checked again at dispatch)."""
    loops: tuple[LoopMark, ...] = ()
    """The loop patterns the call belongs to now (a pattern found looping since refuses it at dispatch)."""


@dataclass(frozen=True, slots=True)
class Reauthorization:
    """A call about to run later than it was requested, and who and what runs it."""

    call: CallView
    capability: Capability
    principal: Principal
    arguments: Mapping[str, Any]
    """The full arguments that will be sent."""
    approval: ApprovalView | None = None
    """The granted approval an approved call runs under; None for a call the user confirmed, which
    must be allowed outright."""
    retry_requested_by: str | None = None
    """Whoever asked for the retry the call is (None for a first call): a requester of it, as the
    principal is, so their approval stands only where the policy lets a requester approve."""


def reauthorize(
    req: Reauthorization, *, policy: PolicyLike, standing: AuthorizationReads, now: datetime
) -> Clearance | Refusal:
    """Authorize `req` again, now: binding, standing, then the current policy (blocking: reads the store)."""
    call, capability, principal, approval = req.call, req.capability, req.principal, req.approval
    if approval is not None and not (
        approval.action_hash == call.action_hash
        and is_action_hash(call.action_hash, capability, req.arguments, principal)
    ):
        return Refusal(
            ReasonCode.APPROVAL_BINDING_MISMATCH, "the action to run is not the action that was approved"
        )
    if standing.is_revoked(principal.tenant, principal.subject):
        return Refusal(ReasonCode.PRINCIPAL_REVOKED, f"{principal.subject} was revoked after requesting")
    approver = approval.decided_by if approval is not None else None
    if approver and standing.is_revoked(principal.tenant, approver):
        return Refusal(ReasonCode.APPROVER_REVOKED, f"{approver} was revoked after approving")
    # The call itself is already counted in its run; policy sees the calls before it, as at first.
    counted = standing.run_call_count(call.run_id, call.tenant) if call.run_id is not None else 1
    earlier = max(counted - 1, 0)
    context = CallContext(now=now, run_call_count=earlier)
    inp = PolicyInput(principal, capability, req.arguments, context)
    decision = policy.evaluate(inp)
    # From here on the current policy decides: its refusal names its version and rule.
    version, rule = decision.policy_version, decision.rule_id
    if decision.effect == "deny":
        detail = decision.message or f"policy {version} now denies this call"
        return Refusal(decision.reason or decision.effect, detail, version, rule)
    if decision.effect == "require_approval":
        needed = decision.approval
        if approval is None:
            # Confirmed by the user, but policy now wants an approver: it may not run on the answer.
            detail = f"policy {version} now needs approval"
            return Refusal(decision.reason or decision.effect, detail, version, rule)
        if needed is None or needed.approver_role != approval.approver_role:
            role = needed.approver_role if needed else "?"
            detail = f"policy {version} now needs approval by role {role!r}"
            return Refusal(ReasonCode.APPROVAL_INSUFFICIENT, detail, version, rule)
        if not needed.requester_may_approve:
            if approval.decided_by == principal.subject:
                detail = "the requester approved their own call"
                return Refusal(ReasonCode.SELF_APPROVAL_FORBIDDEN, detail, version, rule)
            if approval.decided_by == req.retry_requested_by:
                detail = "the person who asked for this retry approved it"
                return Refusal(ReasonCode.SELF_APPROVAL_FORBIDDEN, detail, version, rule)
    try:
        charges = policy.charges(inp, call.run_id)
    except ExpressionError as exc:
        # As at admission: an amount that cannot be counted refuses the call; a budget is never skipped.
        return Refusal(POLICY_ERROR, str(exc), version, exc.rule_id)
    return Clearance(capability, req.arguments, version, charges, policy.loop_marks(inp))


def decision_record(decision: Decision) -> DecisionRecord:
    """`decision` as recorded with a call's intent (the store does not import policy)."""
    need = decision.approval
    return DecisionRecord(
        effect=decision.effect,
        reason=decision.reason,
        policy_version=decision.policy_version,
        rule_id=decision.rule_id,
        approval=(
            ApprovalNeed(need.approver_role, need.expires_in_s, need.requester_may_approve) if need else None
        ),
        message=decision.message,
        also_matched=decision.also_matched,
    )


def principal_of_record(recorded: PrincipalRecord) -> Principal:
    """The principal as recorded with the request."""
    return Principal(
        subject=recorded.subject,
        tenant=recorded.tenant,
        roles=frozenset(recorded.roles),
        scopes=frozenset(recorded.scopes),
        client_id=recorded.client_id,
        groups=frozenset(recorded.groups),
    )


def record_of(principal: Principal) -> PrincipalRecord:
    """The principal as the store records it with a request."""
    return PrincipalRecord(
        subject=principal.subject,
        tenant=principal.tenant,
        roles=tuple(sorted(principal.roles)),
        scopes=tuple(sorted(principal.scopes)),
        client_id=principal.client_id,
        groups=tuple(sorted(principal.groups)),
    )
