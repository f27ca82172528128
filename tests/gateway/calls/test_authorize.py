from __future__ import annotations

import json

import pytest

from gateway.calls.authorize import decision_record
from policy.model import ApprovalRequirement, Decision

DECISIONS = [
    (
        Decision("allow", "within_limits", "7", rule_id="small-refunds"),
        '{"effect": "allow", "reason": "within_limits", "policy_version": "7", "rule_id": "small-refunds",'
        ' "approval": null, "message": null}',
    ),
    (
        Decision("deny", "amount_over_limit", "7", rule_id="max-refund", message="over 1000"),
        '{"effect": "deny", "reason": "amount_over_limit", "policy_version": "7", "rule_id": "max-refund",'
        ' "approval": null, "message": "over 1000"}',
    ),
    (
        Decision(
            "require_approval",
            "amount_over_100",
            "8",
            "big",
            ApprovalRequirement("finance", 600, True),
            "ask",
        ),
        '{"effect": "require_approval", "reason": "amount_over_100", "policy_version": "8", "rule_id": "big",'
        ' "approval": {"approver_role": "finance", "expires_in_s": 600, "requester_may_approve": true},'
        ' "message": "ask"}',
    ),
]


@pytest.mark.parametrize(("decision", "recorded"), DECISIONS, ids=[d.effect for d, _ in DECISIONS])
def test_a_decision_is_recorded_with_every_key_in_the_hashed_order(decision: Decision, recorded: str) -> None:
    # The payload is hashed into the log: the record must keep every key, in order.
    assert json.dumps(decision_record(decision).to_json()) == recorded
