"""Validation of the `policy:` config section: clear errors that name the rule and the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from policy import Policy, PolicyConfig, PolicyError, load_policy_file, parse_duration

from .helpers import DEMO_POLICY, call


def load_error(*rules: dict[str, Any]) -> str:
    with pytest.raises(PolicyError) as caught:
        Policy.from_mapping({"rules": list(rules)})
    return str(caught.value)


def test_an_unknown_key_in_a_rule_is_an_error_naming_the_rule_and_key() -> None:
    message = load_error({"id": "r1", "decision": "allow", "tool": ["x"]})
    assert "rule 'r1'" in message
    assert "tool" in message
    assert "Extra inputs are not permitted" in message


def test_an_unknown_top_level_key_is_an_error() -> None:
    with pytest.raises(PolicyError, match="rulez"):
        Policy.from_mapping({"rulez": []})


def test_require_approval_without_an_approver_role_is_an_error() -> None:
    message = load_error({"id": "needs-ok", "decision": "require_approval"})
    assert "rule 'needs-ok'" in message
    assert "approval.approver_role" in message

    message = load_error({"id": "needs-ok", "decision": "require_approval", "approval": {"expires_in": 60}})
    assert "rule 'needs-ok'" in message
    assert "approver_role" in message


def test_an_approval_block_on_a_rule_that_does_not_require_approval_is_an_error() -> None:
    message = load_error({"id": "odd", "decision": "allow", "approval": {"approver_role": "x"}})
    assert "rule 'odd'" in message and "only applies to decision require_approval" in message


def test_an_unknown_decision_or_effect_class_is_an_error_naming_the_rule() -> None:
    assert "rule 'r'" in load_error({"id": "r", "decision": "maybe"})
    message = load_error({"id": "r", "decision": "allow", "effects": ["delete"]})
    assert "rule 'r'" in message and "effects" in message


def test_the_second_of_several_rules_is_named_by_id_and_position() -> None:
    message = load_error(
        {"id": "fine", "decision": "allow"},
        {
            "id": "bad",
            "decision": "require_approval",
            "approval": {"approver_role": "a", "expires_in": "soon"},
        },
    )
    assert "rules.1" in message
    assert "rule 'bad'" in message
    assert "approval.expires_in" in message
    assert "fine" not in message


def test_duplicate_rule_ids_are_an_error() -> None:
    message = load_error({"id": "twice", "decision": "allow"}, {"id": "twice", "decision": "deny"})
    assert "rule 'twice'" in message and "more than one rule" in message


def test_empty_scope_lists_are_an_error_rather_than_matching_nothing() -> None:
    assert "roles" in load_error({"id": "r", "roles": [], "decision": "allow"})
    assert "tools" in load_error({"id": "r", "tools": [], "decision": "allow"})


def test_engine_reason_codes_are_reserved() -> None:
    assert "reserved" in load_error({"id": "r", "decision": "deny", "reason": "policy_error"})
    assert "reserved" in load_error({"id": "r", "decision": "deny", "reason": "no_matching_rule"})


def test_a_rule_without_an_id_is_reported_as_such() -> None:
    assert "rule without a valid id" in load_error({"decision": "allow"})


def test_the_reason_defaults_to_the_rule_id() -> None:
    config = PolicyConfig.model_validate({"rules": [{"id": "r", "decision": "allow"}]})
    assert config.rules[0].reason_code == "r"


def test_validation_errors_also_name_the_rule_when_the_section_is_embedded_in_a_larger_model() -> None:
    with pytest.raises(ValidationError, match="rule 'needs-ok'"):
        PolicyConfig.model_validate({"rules": [{"id": "needs-ok", "decision": "require_approval"}]})


@pytest.mark.parametrize(
    ("text", "seconds"),
    [(90, 90), ("90", 90), ("90s", 90), ("30m", 1800), ("1h", 3600), ("2d", 172800), (" 5 m ", 300)],
)
def test_durations_accept_seconds_and_unit_suffixes(text: object, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", [0, -5, "0s", "1w", "1.5h", "h", True, None, 1.5])
def test_durations_reject_anything_else(text: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_load_policy_file_reads_a_whole_config_or_just_the_section(tmp_path: Path) -> None:
    whole = tmp_path / "writ.yaml"
    whole.write_text(
        """
server: {port: 8080}
policy:
  rules:
    - id: agents-look-up-orders
      tools: [lookup_order]
      roles: [agent]
      decision: allow
    - id: agents-refund
      tools: [refund_order]
      roles: [agent]
      decision: allow
    - id: refunds-need-approval-over-100
      tools: [refund_order]
      roles: [agent]
      when: "args.amount > 100"
      decision: require_approval
      reason: amount_over_approval_threshold
      approval: {approver_role: approver, expires_in: 1h, requester_may_approve: false}
    - id: refunds-over-10000-denied
      tools: [refund_order]
      when: "args.amount > 10000"
      decision: deny
      reason: amount_over_limit
      message: "Refunds over 10000 need a manual process."
""",
        encoding="utf-8",
    )
    policy = load_policy_file(whole)
    assert policy.version == Policy.from_mapping(DEMO_POLICY).version
    assert policy.evaluate(call(amount=250)).effect == "require_approval"

    section = tmp_path / "policy.yaml"
    section.write_text("rules:\n  - {id: all, decision: allow}\n", encoding="utf-8")
    assert load_policy_file(section).evaluate(call()).effect == "allow"


def test_load_policy_file_reports_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot load policy"):
        load_policy_file(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules: [\n", encoding="utf-8")
    with pytest.raises(PolicyError, match="cannot load policy"):
        load_policy_file(bad)
    listed = tmp_path / "list.yaml"
    listed.write_text("- id: x\n", encoding="utf-8")
    with pytest.raises(PolicyError, match="expected a mapping"):
        load_policy_file(listed)
