"""Budget charges and loop marks as the store counts them: each policy `BudgetCharge` as a counter key
and micro-units, each `LoopMark` as a `LoopKey`.

The key is a SHA-256 over the budget, its scope and its window, so a counter never holds a subject's
or a run's name, and a renamed budget, another scope or the next window each start a new counter.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from decimal import ROUND_CEILING, Decimal

from policy.budgets import BudgetCharge
from policy.loops import LoopMark
from store.model import ApprovalNeed, Charge, LoopKey

MICROS = Decimal(1_000_000)


def store_charges(charges: Iterable[BudgetCharge]) -> tuple[Charge, ...]:
    """`charges` as the store records and checks them."""
    return tuple(
        Charge(
            budget_id=c.budget_id,
            counter_key=counter_key(c),
            amount_micros=micros(c.amount),
            limit_micros=micros(c.limit),
            window_start=c.window_start,
            resets_at=c.resets_at,
            scope=c.scope,
            approval=(
                ApprovalNeed(
                    c.approval.approver_role, c.approval.expires_in_s, c.approval.requester_may_approve
                )
                if c.approval
                else None
            ),
        )
        for c in charges
    )


def counter_key(charge: BudgetCharge) -> str:
    """The counter a charge adds to: one per budget, scope, scope members and window."""
    window = "run" if charge.window_start is None else charge.window_start.isoformat()
    parts = [charge.budget_id, charge.scope, *charge.scope_parts, window]
    return hashlib.sha256(json.dumps(parts, ensure_ascii=False).encode("utf-8")).hexdigest()


def micros(amount: Decimal) -> int:
    """Millionths of a unit, rounded up: a fraction below a millionth never escapes the count."""
    return int((amount * MICROS).to_integral_value(rounding=ROUND_CEILING))


def store_loops(marks: Iterable[LoopMark]) -> tuple[LoopKey, ...]:
    """`marks` as the store counts and checks them."""
    return tuple(
        LoopKey(
            rule_id=m.rule_id,
            kind=m.kind,
            pattern=m.pattern,
            threshold=m.threshold,
            window_s=m.window_s,
            window_start=m.window_start,
            resets_at=m.resets_at,
            action=m.action,
        )
        for m in marks
    )
