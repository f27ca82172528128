"""A policy's `tools` entries checked against the tools Writ has: which name none, and which of those
would fail open (policy/naming.py)."""

from __future__ import annotations

from typing import Any

from capabilities.contract import Capability
from policy.naming import tool_names, unmatched_tools
from policy.rules import PolicyConfig

# What the demo's two capabilities answer to: tool names, capability ids, refs.
NAMES = {"lookup_order", "refund_order", "lookup-order", "refund-order", "lookup-order@1", "refund-order@2"}


def policy(**sections: Any) -> PolicyConfig:
    return PolicyConfig.model_validate(sections)


def rule(rule_id: str, decision: str, *tools: str) -> dict[str, Any]:
    found: dict[str, Any] = {"id": rule_id, "tools": list(tools), "decision": decision}
    if decision == "require_approval":
        found["approval"] = {"approver_role": "approver"}
    return found


def test_a_misspelled_tool_in_an_approval_rule_is_found_with_the_name_it_is_closest_to() -> None:
    [found] = unmatched_tools(policy(rules=[rule("over-100", "require_approval", "refund_ordr")]), NAMES)
    assert (found.owner, found.entry, found.fails_open, found.is_glob) == (
        "rule 'over-100'",
        "refund_ordr",
        True,
        False,
    )
    assert found.close[0] == "refund_order"
    assert str(found) == (
        "rule 'over-100' names tool 'refund_ordr', which no capability has "
        f"(did you mean {' or '.join(repr(name) for name in found.close)}?)"
    )


def test_deny_rules_budgets_and_loop_rules_fail_open_and_an_allow_rule_fails_closed() -> None:
    config = policy(
        rules=[rule("frozen", "deny", "refund_ordr"), rule("agents", "allow", "notes_extra")],
        budgets=[{"id": "spend", "tools": ["refnd_order"], "window": "1h", "limit": 5}],
        loops=[{"id": "again", "tools": ["lookup-ordr"], "threshold": 3, "window": "10m"}],
    )
    found = {(u.owner, u.entry): u.fails_open for u in unmatched_tools(config, NAMES)}
    assert found == {
        ("rule 'frozen'", "refund_ordr"): True,
        ("rule 'agents'", "notes_extra"): False,
        ("budget 'spend'", "refnd_order"): True,
        ("loop rule 'again'", "lookup-ordr"): True,
    }


def test_a_tool_named_by_its_name_id_or_ref_or_matched_by_a_glob_is_not_reported() -> None:
    config = policy(
        rules=[
            rule("by-name", "deny", "refund_order"),
            rule("by-id", "deny", "refund-order"),
            rule("by-ref", "deny", "refund-order@2"),
            rule("by-glob", "deny", "refund_*"),
            rule("any", "deny", "*"),
        ]
    )
    assert unmatched_tools(config, NAMES) == []


def test_a_glob_matching_nothing_is_reported_as_a_glob_without_suggestions() -> None:
    [found] = unmatched_tools(policy(rules=[rule("notes", "deny", "notes.*")]), NAMES)
    assert (found.entry, found.is_glob, found.close) == ("notes.*", True, ())


def test_a_star_matches_even_when_there_are_no_tools_and_resource_rules_are_not_about_tools() -> None:
    config = policy(
        rules=[
            rule("everything", "deny", "*"),
            {"id": "docs", "resources": ["file:///nowhere/*"], "decision": "deny"},
        ]
    )
    assert unmatched_tools(config, set()) == []


def test_the_names_a_tools_entry_may_match_are_each_tools_name_id_and_ref() -> None:
    refund = Capability(
        id="refund-order", version="2", tool_name="refund_order", backend="acme", input_schema={}
    )
    notes = Capability(
        id="files/resources",
        version="1",
        tool_name="resources/read",
        backend="files",
        input_schema={},
        kind="resource",
    )
    assert tool_names([refund, notes]) == {"refund_order", "refund-order", "refund-order@2"}
