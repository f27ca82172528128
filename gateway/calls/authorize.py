"""Authorization at the crossing into the store: policy's decision as the store records it."""

from __future__ import annotations

from policy.model import Decision
from store.model import ApprovalNeed, DecisionRecord


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
    )
