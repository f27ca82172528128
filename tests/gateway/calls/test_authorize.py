from __future__ import annotations

import json

import pytest

from gateway.calls.authorize import decision_record
from policy.model import ApprovalRequirement, Decision

DECISIONS = [
    Decision("allow", "within_limits", "7", rule_id="small-refunds"),
    Decision("deny", "amount_over_limit", "7", rule_id="max-refund", message="over 1000"),
    Decision(
        "require_approval", "amount_over_100", "8", "big", ApprovalRequirement("finance", 600, True), "ask"
    ),
]


@pytest.mark.parametrize("decision", DECISIONS, ids=lambda d: d.effect)
def test_a_decision_is_recorded_as_the_same_json_policy_gives_it(decision: Decision) -> None:
    # The payload is hashed into the log: the record must keep every key, in order.
    assert json.dumps(decision_record(decision).to_json()) == json.dumps(decision.to_json())
