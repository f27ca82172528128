"""Properties that must hold for every policy and every call: deny by default, order independence,
and that a deny can only ever make a decision stricter."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from capabilities.contract import Capability
from policy import NO_MATCH, POLICY_ERROR, CallContext, Decision, Policy, PolicyInput, Principal
from policy.engine import RESTRICTIVENESS

from .helpers import LOOKUP, NOW, REFUND, capability

CAPABILITIES = (LOOKUP, REFUND, capability("refund_payment", effect="write"))

CONDITIONS = (
    "args.amount > 100",  # fails to evaluate when amount is missing
    "has(args.amount) && args.amount > 5000",
    "principal.tenant == 'acme'",
    "context.run_call_count > 2",
    "capability.effect == 'read'",
)

names = st.sampled_from
optional_subset = st.none() | st.lists(
    names(("agent", "approver", "admin")), min_size=1, max_size=3, unique=True
)


@st.composite
def rule_bodies(draw: st.DrawFn, decision: st.SearchStrategy[str] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "tools": draw(names((["*"], ["refund_order"], ["lookup_order"], ["refund_*"], ["lookup-order"]))),
        "decision": draw(names(("allow", "deny", "require_approval")) if decision is None else decision),
    }
    if (roles := draw(optional_subset)) is not None:
        body["roles"] = roles
    if draw(st.booleans()):
        body["tenants"] = [draw(names(("acme", "globex")))]
    if draw(st.booleans()):
        body["effects"] = draw(st.lists(names(("read", "write", "irreversible")), min_size=1, unique=True))
    if draw(st.booleans()):
        body["when"] = draw(names(CONDITIONS))
    if body["decision"] == "require_approval":
        body["approval"] = {"approver_role": draw(names(("approver", "admin")))}
    return body


def with_ids(bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"id": f"r{i}", **body} for i, body in enumerate(bodies)]


rule_lists = st.lists(rule_bodies(), max_size=6).map(with_ids)


@st.composite
def calls(draw: st.DrawFn) -> PolicyInput:
    roles = draw(st.frozensets(names(("agent", "approver", "admin", "viewer")), max_size=3))
    who = Principal(
        subject=draw(names(("alice", "bob"))), tenant=draw(names(("acme", "globex"))), roles=roles
    )
    arguments: dict[str, Any] = {"order_id": "1001"}
    if draw(st.booleans()):
        arguments["amount"] = draw(st.integers(min_value=-10, max_value=20000))
    cap: Capability = draw(names(CAPABILITIES))
    context = CallContext(now=NOW, run_call_count=draw(st.integers(min_value=0, max_value=5)))
    return PolicyInput(principal=who, capability=cap, arguments=arguments, context=context)


def rank(decision: Decision) -> int:
    return RESTRICTIVENESS[decision.effect]


def kind(decision: Decision) -> tuple[str, bool, bool]:
    return decision.effect, decision.reason == POLICY_ERROR, decision.reason == NO_MATCH


@settings(deadline=None)
@given(inp=calls())
def test_without_rules_every_call_is_denied(inp: PolicyInput) -> None:
    policy = Policy.from_mapping({"rules": []})
    decision = policy.evaluate(inp)
    assert (decision.effect, decision.reason) == ("deny", NO_MATCH)
    assert not policy.may_list(inp.principal, inp.capability)


@settings(deadline=None)
@given(
    rules=rule_lists,
    added=rule_bodies(decision=st.just("deny")),
    position=st.integers(min_value=0, max_value=6),
    inp=calls(),
)
def test_adding_a_deny_rule_never_makes_a_decision_less_restrictive(
    rules: list[dict[str, Any]], added: dict[str, Any], position: int, inp: PolicyInput
) -> None:
    before = Policy.from_mapping({"rules": rules})
    after = Policy.from_mapping({"rules": [*rules[:position], {"id": "added", **added}, *rules[position:]]})
    old, new = before.evaluate(inp), after.evaluate(inp)
    assert rank(new) >= rank(old)
    if any(t.rule_id == "added" and t.outcome == "matched" for t in after.trace(inp)):
        assert new.effect == "deny"
    assert after.may_list(inp.principal, inp.capability) <= before.may_list(inp.principal, inp.capability)


@settings(deadline=None)
@given(data=st.data(), rules=rule_lists, inp=calls())
def test_the_decision_does_not_depend_on_rule_order(
    data: st.DataObject, rules: list[dict[str, Any]], inp: PolicyInput
) -> None:
    shuffled = data.draw(st.permutations(rules))
    original, reordered = Policy.from_mapping({"rules": rules}), Policy.from_mapping({"rules": shuffled})
    assert kind(reordered.evaluate(inp)) == kind(original.evaluate(inp))
    assert reordered.may_list(inp.principal, inp.capability) == original.may_list(
        inp.principal, inp.capability
    )


@settings(deadline=None)
@given(rules=rule_lists, inp=calls())
def test_an_allowing_decision_is_always_backed_by_a_matching_rule_of_that_kind(
    rules: list[dict[str, Any]], inp: PolicyInput
) -> None:
    policy = Policy.from_mapping({"rules": rules})
    decision = policy.evaluate(inp)
    if decision.effect != "deny":
        traces = {t.rule_id: t for t in policy.trace(inp)}
        winner = traces[decision.rule_id or ""]
        assert (winner.outcome, winner.decision) == ("matched", decision.effect)
        assert all(t.decision != "deny" for t in traces.values() if t.outcome in ("matched", "error"))
        assert policy.may_list(inp.principal, inp.capability)
    if decision.effect == "require_approval":
        assert decision.approval is not None
    else:
        assert decision.approval is None
    assert decision.policy_version == policy.version
