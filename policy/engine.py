"""The decision: principal + capability + concrete arguments + context -> allow, deny or approval.

Deny by default and order-independent: every rule whose scope matches and whose condition holds is
collected, and the most restrictive decision among them wins (deny > require_approval > allow). File
order only picks which of several equally restrictive rules names the reason. A condition that cannot
be evaluated fails closed: the call is denied with reason `policy_error`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import rfc8785
import yaml
from pydantic import ValidationError

from capabilities.contract import Capability, config_problems

from .budgets import BudgetCharge, Budgets
from .cel import RUN_CALL_COUNT, Activation, Condition, ExpressionError, activation_for
from .loops import LoopMark, Loops
from .model import ApprovalRequirement, Decision, Effect, PolicyError, PolicyInput, Principal
from .rules import PolicyConfig, Rule
from .scope import in_scope

NO_MATCH = "no_matching_rule"
POLICY_ERROR = "policy_error"

RESTRICTIVENESS: Mapping[Effect, int] = {"allow": 0, "require_approval": 1, "deny": 2}

Outcome = Literal["out_of_scope", "condition_false", "matched", "error"]


@dataclass(frozen=True, slots=True)
class RuleTrace:
    """How one rule fared against one call: what `writ` shows when asked why."""

    rule_id: str
    outcome: Outcome
    decision: Effect
    problem: str | None = None


@dataclass(frozen=True, slots=True)
class _CompiledRule:
    rule: Rule
    condition: Condition | None

    def in_scope(
        self, principal: Principal, capability: Capability, arguments: Mapping[str, Any] | None = None
    ) -> bool:
        return in_scope(self.rule, principal, capability, arguments)


class Policy:
    """A loaded, compiled policy. Immutable; safe to share between concurrent calls."""

    def __init__(self, config: PolicyConfig) -> None:
        """Compile every rule's condition.

        Raises:
            PolicyError: a `when` expression is not valid CEL.
        """
        self._config = config
        self._rules = tuple(
            _CompiledRule(rule, Condition.compile(rule.id, rule.when) if rule.when else None)
            for rule in config.rules
        )
        self._budgets = Budgets(config.budgets)
        self._loops = Loops(config.loops)
        # `context.run_call_count` is a declared variable of its own (policy.cel), so an expression that
        # reads it spells it out; a policy none of whose expressions does never needs it counted.
        expressions = [r.when for r in config.rules] + [
            e for b in config.budgets for e in (b.amount, b.currency)
        ]
        self._reads_run_call_count = any(e and RUN_CALL_COUNT in e for e in expressions)
        # RFC 8785, as every other hash (store.canonical, which policy may not import): the rules hold
        # strings, small integers and booleans, which it spells as the earlier json.dumps did, so a
        # policy keeps its version across the change.
        canonical = rfc8785.dumps(config.canonical())
        self._version = "p-" + hashlib.sha256(canonical).hexdigest()[:16]

    @classmethod
    def from_config(cls, config: PolicyConfig) -> Policy:
        """Build from an already validated `policy:` section.

        Raises:
            PolicyError: a `when` expression is not valid CEL.
        """
        return cls(config)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> Policy:
        """Build from the raw `policy:` section (as parsed from YAML or JSON).

        Raises:
            PolicyError: the section is malformed; the message names each offending rule and field.
        """
        try:
            config = PolicyConfig.model_validate(data)
        except ValidationError as exc:
            raise PolicyError("invalid policy:\n" + "\n".join(config_problems(exc.errors(), data))) from exc
        return cls(config)

    @property
    def reads_run_call_count(self) -> bool:
        """Whether any expression reads `context.run_call_count` (else the caller need not count)."""
        return self._reads_run_call_count

    @property
    def version(self) -> str:
        """`p-` + 16 hex of the SHA-256 of the canonical rules: equal content, equal version."""
        return self._version

    @property
    def config(self) -> PolicyConfig:
        return self._config

    def evaluate(self, inp: PolicyInput) -> Decision:
        """Decide one concrete call. Never raises for rule or argument problems: those deny."""
        return self._decide(self.trace(inp))

    def trace(self, inp: PolicyInput) -> tuple[RuleTrace, ...]:
        """Every rule's verdict on this call, in file order."""
        activation: Activation | None = None
        traces: list[RuleTrace] = []
        for compiled in self._rules:
            rule = compiled.rule
            if not compiled.in_scope(inp.principal, inp.capability, inp.arguments):
                traces.append(RuleTrace(rule.id, "out_of_scope", rule.decision))
                continue
            if compiled.condition is None:
                traces.append(RuleTrace(rule.id, "matched", rule.decision))
                continue
            try:
                if activation is None:
                    activation = _activation(rule.id, compiled.condition.source, inp)
                held = compiled.condition.holds(activation)
            except ExpressionError as exc:
                traces.append(RuleTrace(rule.id, "error", rule.decision, problem=str(exc)))
                continue
            traces.append(RuleTrace(rule.id, "matched" if held else "condition_false", rule.decision))
        return tuple(traces)

    def charges(self, inp: PolicyInput, run_id: str | None) -> tuple[BudgetCharge, ...]:
        """What this call counts against each budget that covers it (see `Budgets.charges`).

        Raises:
            ExpressionError: a budget's amount or currency cannot be evaluated for this call.
        """
        return self._budgets.charges(inp, run_id)

    def loop_marks(self, inp: PolicyInput) -> tuple[LoopMark, ...]:
        """The loop patterns this call belongs to (see `Loops.marks`)."""
        return self._loops.marks(inp)

    def may_list(self, principal: Principal, capability: Capability, uri: str | None = None) -> bool:
        """Whether the tool (prompt, or resource at `uri`) may be shown: some allowing rule could apply,
        and no unconditional deny does."""
        arguments = {"uri": uri} if uri is not None else None
        in_scope = [c.rule for c in self._rules if c.in_scope(principal, capability, arguments)]
        if any(rule.decision == "deny" and rule.when is None for rule in in_scope):
            return False
        return any(rule.decision != "deny" for rule in in_scope)

    def _decide(self, traces: Sequence[RuleTrace]) -> Decision:
        errors = [t for t in traces if t.outcome == "error"]
        if errors:
            first = errors[0]
            return Decision(
                effect="deny",
                reason=POLICY_ERROR,
                policy_version=self._version,
                rule_id=first.rule_id,
                message=first.problem,
            )
        matched = [t for t in traces if t.outcome == "matched"]
        if not matched:
            return Decision(
                effect="deny",
                reason=NO_MATCH,
                policy_version=self._version,
                message="no policy rule allows this call",
            )
        strictest = max(RESTRICTIVENESS[t.decision] for t in matched)
        winner = next(t for t in matched if RESTRICTIVENESS[t.decision] == strictest)
        rule = self._rule(winner.rule_id)
        # The rule's `message` is the operator's text for the user, shown as written; which other rules
        # matched is Writ's own account, kept apart so that neither is mistaken for the other.
        return Decision(
            effect=rule.decision,
            reason=rule.reason_code,
            policy_version=self._version,
            rule_id=rule.id,
            approval=_approval(rule),
            message=rule.message,
            also_matched=tuple(t.rule_id for t in matched if t is not winner),
        )

    def _rule(self, rule_id: str) -> Rule:
        return next(c.rule for c in self._rules if c.rule.id == rule_id)


def load_policy_file(path: str | Path) -> Policy:
    """Read a YAML file holding either a whole Writ config (its `policy:` section) or just that section.

    Raises:
        PolicyError: the file cannot be read or parsed, or the policy in it is invalid.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
        data = yaml.safe_load(text)
    except (OSError, yaml.YAMLError) as exc:
        raise PolicyError(f"cannot load policy from {path}: {exc}") from exc
    if data is None:
        data = {}
    if isinstance(data, Mapping) and "policy" in data:
        data = data["policy"] or {}
    if not isinstance(data, Mapping):
        raise PolicyError(f"{path}: expected a mapping with `rules:` (or a `policy:` section)")
    return Policy.from_mapping(data)


def _activation(rule_id: str, source: str, inp: PolicyInput) -> Activation:
    try:
        return activation_for(inp)
    except (ValueError, TypeError) as exc:
        # The error text may quote the offending value, which may be redacted: name only its kind.
        raise ExpressionError(rule_id, source, "arguments not representable in CEL") from exc


def _approval(rule: Rule) -> ApprovalRequirement | None:
    if rule.approval is None:
        return None
    return ApprovalRequirement(
        approver_role=rule.approval.approver_role,
        expires_in_s=rule.approval.expires_in,
        requester_may_approve=rule.approval.requester_may_approve,
    )
