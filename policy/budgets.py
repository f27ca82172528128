"""What a call counts against each budget that covers it: pure, with `now` taken from the input.

The store keeps the counters and refuses a call that would take one past its limit; this module only
says which counters a call charges, by how much, and when each window resets.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation

from .cel import Activation, ValueExpression, activation_for, type_name
from .model import ApprovalRequirement, PolicyInput
from .rules import Budget, Conversion
from .scope import in_scope


@dataclass(frozen=True, slots=True)
class BudgetCharge:
    """One counter a call draws on: which budget, whose counter, which window, how much of what limit."""

    budget_id: str
    scope: str
    scope_parts: tuple[str, ...]
    """What identifies the counter within its budget: tenant, subject, run, tool, currency as scoped."""
    window_start: datetime | None
    """The start of the fixed UTC window; None for a budget over a run's lifetime."""
    resets_at: datetime | None
    amount: Decimal
    limit: Decimal
    approval: ApprovalRequirement | None = None
    """Who decides a call past the limit (`on_exceed: require_approval`); None: it is refused."""


@dataclass(frozen=True, slots=True)
class _Compiled:
    budget: Budget
    amount: ValueExpression | None
    currency: ValueExpression | None


class Budgets:
    """The compiled `policy.budgets`. Immutable; safe to share between concurrent calls."""

    def __init__(self, budgets: Sequence[Budget]) -> None:
        """Compile each budget's expressions.

        Raises:
            PolicyError: an amount or currency is not valid CEL.
        """
        self._budgets = tuple(
            _Compiled(
                b,
                ValueExpression.compile(b.id, "amount", b.amount) if b.amount else None,
                ValueExpression.compile(b.id, "currency", b.currency) if b.currency else None,
            )
            for b in budgets
        )

    def charges(self, inp: PolicyInput, run_id: str | None) -> tuple[BudgetCharge, ...]:
        """The counters this call draws on, in budget order; a call in no run (`run_id` None) draws
        on no budget scoped to a run.

        Raises:
            ExpressionError: an amount is missing, not a number or negative, or a currency is not a
                string: the call must be denied (`policy_error`), never let through uncounted.
        """
        activation: Activation | None = None
        charges: list[BudgetCharge] = []
        for compiled in self._budgets:
            budget = compiled.budget
            if not in_scope(budget, inp.principal, inp.capability):
                continue
            if budget.scope == "run" and run_id is None:
                continue
            amount = Decimal(1)
            parts = _scope_parts(budget, inp, run_id)
            if compiled.amount is not None:
                activation = activation or _activation(compiled.amount, inp)
                amount = _amount(compiled.amount, activation)
            if compiled.currency is not None:
                activation = activation or _activation(compiled.currency, inp)
                currency = _currency(compiled.currency, activation)
                if budget.convert is not None:
                    amount, currency = _converted(compiled.currency, budget.convert, amount, currency)
                parts = (*parts, currency)
            start, resets = _window(budget.window_s, inp.context.now)
            ask = budget.approval
            approval = None
            if ask is not None:
                approval = ApprovalRequirement(ask.approver_role, ask.expires_in, ask.requester_may_approve)
            charges.append(
                BudgetCharge(budget.id, budget.scope, parts, start, resets, amount, budget.limit, approval)
            )
        return tuple(charges)


def _scope_parts(budget: Budget, inp: PolicyInput, run_id: str | None) -> tuple[str, ...]:
    who = inp.principal
    parts = {
        "principal": (who.tenant, who.subject),
        "tenant": (who.tenant,),
        "run": (who.tenant, run_id or ""),
        "capability": (who.tenant, who.subject, inp.capability.id),
    }
    return parts[budget.scope]


def _window(window_s: int | None, now: datetime) -> tuple[datetime | None, datetime | None]:
    """The fixed window holding `now`, aligned to the epoch in UTC (None, None: a run's lifetime)."""
    if window_s is None:
        return None, None
    return fixed_window(window_s, now)


def fixed_window(window_s: int, now: datetime) -> tuple[datetime, datetime]:
    """The start and end of the fixed window of `window_s` seconds holding `now`, aligned to the epoch."""
    moment = now if now.tzinfo else now.replace(tzinfo=UTC)
    start = datetime.fromtimestamp(math.floor(moment.timestamp() / window_s) * window_s, UTC)
    return start, start + timedelta(seconds=window_s)


def _activation(expression: ValueExpression, inp: PolicyInput) -> Activation:
    try:
        return activation_for(inp)
    except (ValueError, TypeError) as exc:
        raise expression.error("arguments not representable in CEL") from exc


def _amount(expression: ValueExpression, activation: Activation) -> Decimal:
    value = expression.value(activation)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise expression.error(f"yielded {type_name(value)}, not a number")
    try:
        amount = Decimal(str(value))
    except InvalidOperation as exc:  # pragma: no cover - CEL numbers are always decimal text
        raise expression.error("not a number") from exc
    if not amount.is_finite() or amount < 0:
        raise expression.error("yielded a negative or non-finite amount")
    return amount


def _converted(
    expression: ValueExpression, conversion: Conversion, amount: Decimal, currency: str
) -> tuple[Decimal, str]:
    if currency == conversion.to:
        return amount, currency
    rate = conversion.rates.get(currency)
    if rate is None:
        # Counting it unconverted, or not at all, would let spend in an unlisted currency pass the limit.
        raise expression.error(f"no rate converts {currency!r} to {conversion.to}")
    return amount * rate, conversion.to


def _currency(expression: ValueExpression, activation: Activation) -> str:
    value = expression.value(activation)
    if not isinstance(value, str) or not value:
        raise expression.error(f"yielded {type_name(value)}, not a non-empty string")
    return value
