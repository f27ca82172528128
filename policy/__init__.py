"""Pure decisions: principal + capability + concrete arguments + context -> decision. No I/O, no clock."""

from .budgets import BudgetCharge, Budgets
from .engine import NO_MATCH, POLICY_ERROR, Policy, RuleTrace, load_policy_file
from .loops import LoopMark, Loops
from .model import (
    ApprovalRequirement,
    CallContext,
    Decision,
    Effect,
    PolicyError,
    PolicyInput,
    Principal,
)
from .rules import ApprovalConfig, Budget, LoopRule, PolicyConfig, Rule, parse_duration

__all__ = [
    "NO_MATCH",
    "POLICY_ERROR",
    "ApprovalConfig",
    "ApprovalRequirement",
    "Budget",
    "BudgetCharge",
    "Budgets",
    "CallContext",
    "Decision",
    "Effect",
    "LoopMark",
    "LoopRule",
    "Loops",
    "Policy",
    "PolicyConfig",
    "PolicyError",
    "PolicyInput",
    "Principal",
    "Rule",
    "RuleTrace",
    "load_policy_file",
    "parse_duration",
]
