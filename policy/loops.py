"""Which loop patterns a call belongs to: pure, with `now` taken from the input.

The store counts the calls of each pattern in its window and refuses the one past the threshold; this
module only names the pattern (rule, principal, capability, arguments without the ignored fields) and
the window a call falls in.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Literal

import rfc8785

from .budgets import fixed_window
from .model import PolicyInput
from .rules import LoopRule
from .scope import in_scope


@dataclass(frozen=True, slots=True)
class LoopMark:
    """One pattern a call belongs to under one loop rule, in the window holding the call."""

    rule_id: str
    kind: Literal["repeated_action", "near_identical", "repeated_failure"]
    threshold: int
    window_s: int
    pattern: str
    """SHA-256 over the rule, the principal, the capability, the kept arguments and the window start."""
    window_start: datetime
    resets_at: datetime
    action: Literal["deny", "pause_run"] = "deny"
    """What a detection does besides refusing the call: `pause_run` stops the call's run too."""


class Loops:
    """The `policy.loops` rules. Immutable; safe to share between concurrent calls."""

    def __init__(self, rules: Sequence[LoopRule]) -> None:
        self._rules = tuple(rules)

    def marks(self, inp: PolicyInput) -> tuple[LoopMark, ...]:
        """The patterns this call belongs to, in rule order (none when no rule covers it)."""
        marks: list[LoopMark] = []
        for rule in self._rules:
            if not in_scope(rule, inp.principal, inp.capability):
                continue
            start, resets = fixed_window(rule.window, inp.context.now)
            # A rule counting failures counts the capability's calls whatever their arguments.
            kept = (
                None
                if rule.count == "failures"
                else {name: value for name, value in inp.arguments.items() if name not in rule.ignore}
            )
            who = inp.principal
            parts: list[Any] = [rule.id, who.tenant, who.subject, inp.capability.id, kept, start.isoformat()]
            pattern = hashlib.sha256(rfc8785.dumps(parts)).hexdigest()
            mark = LoopMark(rule.id, rule.kind, rule.threshold, rule.window, pattern, start, resets)
            marks.append(mark if rule.on_detect == "deny" else replace(mark, action=rule.on_detect))
        return tuple(marks)
