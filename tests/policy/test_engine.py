"""Decisions of the engine on the demo policy and on small purpose-built ones."""

from __future__ import annotations

from datetime import timedelta

import pytest

from policy import NO_MATCH, POLICY_ERROR, ApprovalRequirement, Policy, PolicyError

from .helpers import AGENT, DEMO_POLICY, LOOKUP, NOW, REFUND, call, call_with, capability, principal


@pytest.fixture(scope="module")
def demo() -> Policy:
    return Policy.from_mapping(DEMO_POLICY)


def test_an_agent_may_look_up_an_order(demo: Policy) -> None:
    decision = demo.evaluate(call(LOOKUP, order_id="1001"))
    assert decision.effect == "allow"
    assert decision.rule_id == "agents-look-up-orders"
    assert decision.reason == "agents-look-up-orders"
    assert decision.policy_version == demo.version


def test_a_small_refund_is_allowed(demo: Policy) -> None:
    decision = demo.evaluate(call(amount=50, order_id="1001"))
    assert (decision.effect, decision.rule_id) == ("allow", "agents-refund")


def test_a_refund_over_100_needs_an_approver_who_is_not_the_requester(demo: Policy) -> None:
    decision = demo.evaluate(call(amount=250, order_id="1001"))
    assert decision.effect == "require_approval"
    assert decision.reason == "amount_over_approval_threshold"
    assert decision.rule_id == "refunds-need-approval-over-100"
    assert decision.approval == ApprovalRequirement(
        approver_role="approver", expires_in_s=3600, requester_may_approve=False
    )


def test_a_refund_over_the_limit_is_denied_even_though_approval_rules_match(demo: Policy) -> None:
    decision = demo.evaluate(call(amount=20000, order_id="1001"))
    assert decision.effect == "deny"
    assert decision.reason == "amount_over_limit"
    assert decision.rule_id == "refunds-over-10000-denied"
    assert decision.approval is None
    assert decision.message is not None
    assert decision.message.startswith("Refunds over 10000 need a manual process.")


def test_a_principal_without_the_agent_role_is_denied_by_default(demo: Policy) -> None:
    decision = demo.evaluate(call(LOOKUP, who=principal("viewer"), order_id="1001"))
    assert decision.effect == "deny"
    assert decision.reason == NO_MATCH
    assert decision.rule_id is None
    assert decision.policy_version == demo.version


def test_may_list_hides_tools_no_rule_could_allow(demo: Policy) -> None:
    viewer = principal("viewer")
    assert not demo.may_list(viewer, REFUND)
    assert not demo.may_list(viewer, LOOKUP)
    assert demo.may_list(AGENT, REFUND)
    assert demo.may_list(AGENT, LOOKUP)


def test_may_list_ignores_conditions_but_honours_unconditional_denies() -> None:
    policy = Policy.from_mapping(
        {
            "rules": [
                {"id": "big-only", "tools": ["refund_order"], "when": "args.amount > 5", "decision": "allow"},
                {"id": "no-interns", "roles": ["intern"], "decision": "deny"},
                {"id": "no-huge", "when": "args.amount > 100", "decision": "deny"},
            ]
        }
    )
    assert policy.may_list(AGENT, REFUND)
    assert not policy.may_list(principal("agent", "intern"), REFUND)
    assert not policy.may_list(AGENT, LOOKUP)


def test_the_message_is_the_deciding_rules_own_and_the_other_matches_are_kept_apart(demo: Policy) -> None:
    denied = demo.evaluate(call(amount=20000))
    assert denied.message == "Refunds over 10000 need a manual process."
    assert denied.also_matched == ("agents-refund", "refunds-need-approval-over-100")
    approval = demo.evaluate(call(amount=250))  # its rule has no message: Writ says none for it
    assert approval.rule_id == "refunds-need-approval-over-100"
    assert approval.message is None
    assert approval.also_matched == ("agents-refund",)


def test_a_condition_that_cannot_be_evaluated_denies_and_names_the_rule(demo: Policy) -> None:
    decision = demo.evaluate(call(order_id="1001"))  # no amount
    assert decision.effect == "deny"
    assert decision.reason == POLICY_ERROR
    assert decision.rule_id == "refunds-need-approval-over-100"
    assert decision.message is not None
    assert "refunds-need-approval-over-100" in decision.message
    assert "args.amount > 100" in decision.message


def test_a_type_mismatch_fails_closed_without_echoing_the_argument() -> None:
    policy = Policy.from_mapping(
        {"rules": [{"id": "small", "when": "args.amount < 100", "decision": "allow"}]}
    )
    decision = policy.evaluate(call(amount="secret-value"))
    assert (decision.effect, decision.reason) == ("deny", POLICY_ERROR)
    assert decision.message is not None
    assert "secret-value" not in decision.message


def test_a_condition_that_is_not_a_boolean_fails_closed() -> None:
    policy = Policy.from_mapping({"rules": [{"id": "sloppy", "when": "args.amount", "decision": "allow"}]})
    decision = policy.evaluate(call(amount=3))
    assert (decision.effect, decision.reason, decision.rule_id) == ("deny", POLICY_ERROR, "sloppy")


def test_arguments_with_no_cel_equivalent_fail_closed() -> None:
    policy = Policy.from_mapping({"rules": [{"id": "any", "when": "true", "decision": "allow"}]})
    assert policy.evaluate(call_with({"blob": object()})).reason == POLICY_ERROR
    assert policy.evaluate(call_with({"huge": 2**70})).reason == POLICY_ERROR


def test_has_guards_a_missing_field() -> None:
    policy = Policy.from_mapping(
        {
            "rules": [
                {"id": "refund", "decision": "allow"},
                {"id": "big", "when": "has(args.amount) && args.amount > 100", "decision": "deny"},
            ]
        }
    )
    assert policy.evaluate(call(order_id="1")).effect == "allow"
    assert policy.evaluate(call(amount=101)).effect == "deny"


def test_a_broken_condition_on_an_unrelated_tool_does_not_affect_other_tools(demo: Policy) -> None:
    assert demo.evaluate(call(LOOKUP)).effect == "allow"


def test_tool_globs_match_tool_names_capability_ids_and_refs() -> None:
    policy = Policy.from_mapping(
        {
            "rules": [
                {"id": "refunds", "tools": ["refund_*"], "decision": "allow"},
                {"id": "by-id", "tools": ["lookup-order"], "decision": "allow"},
                {"id": "by-ref", "tools": ["cancel-order@2"], "decision": "allow"},
            ]
        }
    )
    assert policy.evaluate(call(capability("refund_order"))).rule_id == "refunds"
    assert policy.evaluate(call(capability("refund_payment"))).rule_id == "refunds"
    assert policy.evaluate(call(capability("lookup_order"))).rule_id == "by-id"
    assert policy.evaluate(call(capability("cancel_order"))).rule_id == "by-ref"
    assert policy.evaluate(call(capability("delete_order"))).reason == NO_MATCH
    assert policy.evaluate(call(capability("Refund_order"))).reason == NO_MATCH


def test_the_default_tool_scope_is_every_tool() -> None:
    policy = Policy.from_mapping({"rules": [{"id": "admins", "roles": ["admin"], "decision": "allow"}]})
    assert policy.evaluate(call(capability("anything"), who=principal("admin"))).effect == "allow"


def test_tenants_and_subjects_narrow_a_rule() -> None:
    policy = Policy.from_mapping(
        {
            "rules": [
                {"id": "acme", "tenants": ["acme"], "decision": "allow"},
                {"id": "mallory", "subjects": ["mallory"], "decision": "deny"},
            ]
        }
    )
    assert policy.evaluate(call(who=principal(tenant="acme"))).effect == "allow"
    assert policy.evaluate(call(who=principal(tenant="globex"))).reason == NO_MATCH
    assert policy.evaluate(call(who=principal(subject="mallory", tenant="acme"))).rule_id == "mallory"


def test_effect_classes_narrow_a_rule() -> None:
    policy = Policy.from_mapping({"rules": [{"id": "reads", "effects": ["read"], "decision": "allow"}]})
    assert policy.evaluate(call(LOOKUP)).effect == "allow"
    assert policy.evaluate(call(REFUND)).reason == NO_MATCH


def test_conditions_see_principal_capability_and_context() -> None:
    policy = Policy.from_mapping(
        {
            "rules": [
                {
                    "id": "office-hours",
                    "when": (
                        "'agent' in principal.roles && principal.tenant == 'acme'"
                        " && capability.tool == 'refund_order'"
                        " && capability.effect == 'irreversible' && capability.version == '2'"
                        " && context.now.getHours() >= 9 && context.now < timestamp('2030-01-01T00:00:00Z')"
                        " && context.run_call_count < 5"
                    ),
                    "decision": "allow",
                }
            ]
        }
    )
    assert policy.evaluate(call(run_call_count=4)).effect == "allow"
    assert policy.evaluate(call(run_call_count=5)).reason == NO_MATCH
    assert policy.evaluate(call(now=NOW.replace(hour=3))).reason == NO_MATCH
    assert policy.evaluate(call(now=NOW + timedelta(days=3650))).reason == NO_MATCH


def test_conditions_can_look_into_nested_arguments() -> None:
    policy = Policy.from_mapping(
        {"rules": [{"id": "eur", "when": "args.items.all(i, i.currency == 'EUR')", "decision": "allow"}]}
    )
    assert policy.evaluate(call(items=[{"currency": "EUR"}, {"currency": "EUR"}])).effect == "allow"
    assert policy.evaluate(call(items=[{"currency": "EUR"}, {"currency": "USD"}])).reason == NO_MATCH


def test_the_first_equally_restrictive_rule_in_file_order_names_the_reason() -> None:
    rules = [
        {"id": "first", "decision": "deny", "reason": "first_reason"},
        {"id": "second", "decision": "deny", "reason": "second_reason"},
    ]
    assert Policy.from_mapping({"rules": rules}).evaluate(call()).reason == "first_reason"
    assert Policy.from_mapping({"rules": rules[::-1]}).evaluate(call()).reason == "second_reason"


def test_trace_reports_every_rule_in_file_order(demo: Policy) -> None:
    traces = demo.trace(call(amount=250))
    assert [(t.rule_id, t.outcome) for t in traces] == [
        ("agents-look-up-orders", "out_of_scope"),
        ("agents-refund", "matched"),
        ("refunds-need-approval-over-100", "matched"),
        ("refunds-over-10000-denied", "condition_false"),
    ]


def test_a_policy_without_rules_denies_everything() -> None:
    policy = Policy.from_mapping({})
    assert policy.evaluate(call(amount=1)).reason == NO_MATCH
    assert not policy.may_list(AGENT, REFUND)


def test_the_version_changes_with_content_and_not_with_key_order_or_spelling() -> None:
    base = Policy.from_mapping(DEMO_POLICY)
    reordered = {"rules": [dict(reversed(list(rule.items()))) for rule in DEMO_POLICY["rules"]]}
    assert Policy.from_mapping(reordered).version == base.version

    spelled_out = {"rules": [dict(rule) for rule in DEMO_POLICY["rules"]]}
    spelled_out["rules"][0]["tools"] = ["lookup_order"]
    spelled_out["rules"][2]["approval"] = {"approver_role": "approver", "expires_in": 3600}
    assert Policy.from_mapping(spelled_out).version == base.version

    changed = {"rules": [dict(rule) for rule in DEMO_POLICY["rules"]]}
    changed["rules"][2]["when"] = "args.amount > 200"
    assert Policy.from_mapping(changed).version != base.version
    assert base.version.startswith("p-") and len(base.version) == 18


def test_a_cel_syntax_error_is_refused_at_load_naming_rule_and_expression() -> None:
    with pytest.raises(PolicyError) as caught:
        Policy.from_mapping({"rules": [{"id": "broken", "when": "args.amount >", "decision": "allow"}]})
    assert "broken" in str(caught.value)
    assert "args.amount >" in str(caught.value)


def test_an_unknown_variable_is_refused_at_load() -> None:
    with pytest.raises(PolicyError, match=r"rule 'typo'.*unknown variable 'arg'"):
        Policy.from_mapping({"rules": [{"id": "typo", "when": "arg.amount > 1", "decision": "allow"}]})


def test_the_version_is_the_one_hashed_before_rfc8785_so_a_policy_keeps_it_across_the_change() -> None:
    # Rules hold strings, small integers and booleans, which RFC 8785 spells as json.dumps did: a
    # pending approval's policy version still matches the policy in force after the upgrade.
    import hashlib

    from store.canonical import legacy_json

    policy = Policy.from_mapping(DEMO_POLICY)

    assert (
        policy.version
        == "p-" + hashlib.sha256(legacy_json(policy.config.canonical()).encode()).hexdigest()[:16]
    )


def test_a_policy_says_whether_any_expression_reads_the_run_call_count() -> None:
    counting = Policy.from_mapping(
        {"rules": [{"id": "third", "decision": "deny", "when": "context.run_call_count >= 3"}]}
    )
    assert counting.reads_run_call_count
    plain = Policy.from_mapping({"rules": [{"id": "big", "decision": "deny", "when": "args.amount > 3"}]})
    assert not plain.reads_run_call_count
