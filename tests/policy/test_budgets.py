"""Which budget counters a call draws on: scopes, windows, amounts and currencies, all pure."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from policy import Policy, PolicyError
from policy.cel import ExpressionError

from .helpers import LOOKUP, call, principal

ALLOW_ALL = {"id": "allow-all", "decision": "allow"}


def _policy(*budgets: dict[str, Any]) -> Policy:
    return Policy.from_mapping({"rules": [ALLOW_ALL], "budgets": list(budgets)})


def test_a_window_is_aligned_to_the_epoch_in_utc_and_says_when_it_resets() -> None:
    policy = _policy({"id": "hourly", "window": "1h", "limit": 5})
    late = datetime(2025, 6, 1, 12, 59, 59, 999999, tzinfo=UTC)

    (charge,) = policy.charges(call(now=late, order_id="1"), "run-1")
    (next_hour,) = policy.charges(call(now=late + timedelta(microseconds=1), order_id="1"), "run-1")

    assert charge.window_start == datetime(2025, 6, 1, 12, tzinfo=UTC)
    assert charge.resets_at == datetime(2025, 6, 1, 13, tzinfo=UTC)
    assert next_hour.window_start == charge.resets_at
    assert (charge.amount, charge.limit) == (Decimal(1), Decimal(5))


def test_a_run_budget_never_resets_and_is_keyed_by_the_run() -> None:
    policy = _policy({"id": "per-run", "scope": "run", "window": "run", "limit": 3})

    (charge,) = policy.charges(call(order_id="1"), "run-9")

    assert (charge.window_start, charge.resets_at) == (None, None)
    assert charge.scope_parts == ("acme", "run-9")


def test_principal_tenant_run_and_capability_scopes_name_different_counters() -> None:
    scopes = ["principal", "tenant", "run", "capability"]
    policy = _policy(*({"id": f"b-{s}", "scope": s, "limit": 10} for s in scopes))

    charges = policy.charges(call(order_id="1"), "run-1")

    assert [c.scope_parts for c in charges] == [
        ("acme", "alice"),
        ("acme",),
        ("acme", "run-1"),
        ("acme", "alice", "refund-order"),
    ]


def test_a_budget_applies_only_to_the_calls_in_its_scope() -> None:
    policy = _policy({"id": "refunds", "tools": ["refund_order"], "roles": ["agent"], "limit": 10})

    assert len(policy.charges(call(order_id="1"), "run-1")) == 1
    assert policy.charges(call(LOOKUP, order_id="1"), "run-1") == ()
    assert policy.charges(call(who=principal("viewer"), order_id="1"), "run-1") == ()


def test_spend_counts_the_amount_expression_per_currency() -> None:
    policy = _policy(
        {
            "id": "spend",
            "measure": "spend",
            "amount": "args.amount",
            "currency": "args.currency",
            "limit": 1000,
        }
    )

    (eur,) = policy.charges(call(amount=12.5, currency="EUR"), "run-1")
    (usd,) = policy.charges(call(amount=7, currency="USD"), "run-1")

    assert eur.amount == Decimal("12.5")
    assert usd.amount == Decimal(7)
    assert eur.scope_parts == ("acme", "alice", "EUR")
    assert usd.scope_parts == ("acme", "alice", "USD")


def test_converted_spend_is_counted_in_one_currency_and_an_unlisted_one_fails_closed() -> None:
    policy = _policy(
        {
            "id": "spend",
            "measure": "spend",
            "amount": "args.amount",
            "currency": "args.currency",
            "convert": {"to": "EUR", "rates": {"USD": "0.92"}},
            "limit": 1000,
        }
    )

    (usd,) = policy.charges(call(amount=100, currency="USD"), "run-1")
    (eur,) = policy.charges(call(amount=100, currency="EUR"), "run-1")

    assert (usd.amount, usd.scope_parts) == (Decimal("92.00"), ("acme", "alice", "EUR"))
    assert (eur.amount, eur.scope_parts) == (Decimal(100), ("acme", "alice", "EUR"))
    with pytest.raises(ExpressionError, match="no rate converts 'GBP' to EUR"):
        policy.charges(call(amount=100, currency="GBP"), "run-1")


@pytest.mark.parametrize("amount", ["12", -1, True, None])
def test_an_amount_that_is_not_a_non_negative_number_fails_closed(amount: object) -> None:
    policy = _policy({"id": "spend", "measure": "spend", "amount": "args.amount", "limit": 1000})

    with pytest.raises(ExpressionError, match="budget 'spend'"):
        policy.charges(call(amount=amount), "run-1")


def test_a_missing_amount_fails_closed() -> None:
    policy = _policy({"id": "spend", "measure": "spend", "amount": "args.amount", "limit": 1000})

    with pytest.raises(ExpressionError, match="missing field"):
        policy.charges(call(order_id="1"), "run-1")


def test_budgets_are_validated_when_the_policy_loads() -> None:
    with pytest.raises(PolicyError, match="budget 'spend'.*amount"):
        _policy({"id": "spend", "measure": "spend", "limit": 10})
    with pytest.raises(PolicyError, match="budget 'calls'.*whole number"):
        _policy({"id": "calls", "limit": 2.5})
    with pytest.raises(PolicyError, match="budget 'b'.*window"):
        _policy({"id": "b", "window": "forever", "limit": 1})
    with pytest.raises(PolicyError, match="budget 'b'.*unknown variable"):
        _policy({"id": "b", "measure": "spend", "amount": "arg.amount", "limit": 1})
    with pytest.raises(PolicyError, match="used by more than one budget"):
        _policy({"id": "b", "limit": 1}, {"id": "b", "limit": 2})


def test_budgets_are_part_of_the_policy_version_and_no_budgets_leave_it_unchanged() -> None:
    plain = Policy.from_mapping({"rules": [ALLOW_ALL]})
    empty = Policy.from_mapping({"rules": [ALLOW_ALL], "budgets": []})
    limited = _policy({"id": "b", "limit": 1})

    assert plain.version == empty.version
    assert limited.version != plain.version
