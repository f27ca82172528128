"""CEL conditions: compiled once, evaluated safely, failing loudly at load and closed at runtime."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from policy import PolicyError
from policy.cel import Condition, ExpressionError, activation_for, to_cel

from .helpers import NOW, call


def holds(source: str, **arguments: object) -> bool:
    return Condition.compile("r", source).holds(activation_for(call(**arguments)))


def test_conditions_compare_json_numbers_across_int_and_float() -> None:
    assert holds("args.amount > 100", amount=100.5)
    assert not holds("args.amount > 100", amount=100)


def test_python_is_never_evaluated() -> None:
    with pytest.raises(PolicyError):
        Condition.compile("r", "__import__('os').system('true')")
    with pytest.raises(PolicyError):
        Condition.compile("r", "args.amount > 1; import os")


def test_variables_bound_by_macros_are_not_unknown() -> None:
    assert holds(
        "args.lines.exists(l, l.sku == 'A') && args.lines.map(l, l.qty).all(q, q > 0)",
        lines=[{"sku": "A", "qty": 1}, {"sku": "B", "qty": 2}],
    )


def test_type_names_may_be_used_in_conditions() -> None:
    assert holds("type(args.amount) == int", amount=3)


def test_a_missing_field_names_the_field_and_suggests_has() -> None:
    with pytest.raises(ExpressionError, match=r"missing field.*'amount'.*has\(") as caught:
        holds("args.amount > 1")
    assert caught.value.rule_id == "r"
    assert caught.value.source == "args.amount > 1"


def test_division_by_zero_is_an_expression_error() -> None:
    with pytest.raises(ExpressionError, match="division by zero"):
        holds("args.amount / 0 > 1", amount=5)


def test_a_naive_now_is_taken_as_utc() -> None:
    naive = call(now=NOW.replace(tzinfo=None))
    condition = Condition.compile("r", "context.now == timestamp('2025-06-01T12:00:00Z')")
    assert condition.holds(activation_for(naive))


def test_to_cel_converts_json_shapes_and_time() -> None:
    value = to_cel(
        {"a": [1, 2.5, "x", None, True], "t": datetime(2025, 1, 1, tzinfo=UTC), "d": timedelta(seconds=5)}
    )
    assert isinstance(value, dict)
    with pytest.raises(ValueError):
        to_cel({"bad": {1, 2}})


def test_an_unknown_function_is_refused_at_load() -> None:
    with pytest.raises(PolicyError, match=r"rule 'r'.*unknown function 'startswith'"):
        Condition.compile("r", "args.name.startswith('a')")
