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


def test_to_cel_takes_json_shapes_and_refuses_what_cel_cannot_hold() -> None:
    value = to_cel({"a": [1, 2.5, "x", None, True], "b": ({"c": 1},)})
    assert value == {"a": [1, 2.5, "x", None, True], "b": [{"c": 1}]}
    for bad in ({1, 2}, datetime(2025, 1, 1, tzinfo=UTC), timedelta(seconds=5), 2**63, -(2**63) - 1):
        with pytest.raises(ValueError):
            to_cel({"bad": bad})


def test_an_argument_outside_cel_s_integer_range_fails_closed() -> None:
    with pytest.raises(ValueError):
        activation_for(call(amount=2**64))


def test_an_unknown_function_is_refused_at_load() -> None:
    with pytest.raises(PolicyError, match=r"rule 'r'.*unknown function 'startswith'"):
        Condition.compile("r", "args.name.startswith('a')")


def test_an_unknown_context_field_is_refused_at_load() -> None:
    with pytest.raises(PolicyError, match=r"rule 'r'.*unknown variable 'context.nope'"):
        Condition.compile("r", "context.nope > 1")


def test_a_missing_key_computed_from_the_arguments_is_not_repeated() -> None:
    with pytest.raises(ExpressionError, match="missing field") as caught:
        holds("args.limits[args.account] > 1", limits={"a": 1}, account="acct-secret-7731")
    assert "acct-secret-7731" not in str(caught.value)


def test_numbers_compare_across_int_and_double_both_ways() -> None:
    assert holds("args.amount > 10.5", amount=11)
    assert holds("10.5 < args.amount", amount=11)
    assert not holds("args.amount == 10.5", amount=10)


def test_a_type_mismatch_is_named_without_the_value() -> None:
    with pytest.raises(ExpressionError, match="type mismatch") as caught:
        holds("args.amount + 'x' == 'y'", amount=12345)
    assert "12345" not in str(caught.value)


def test_a_double_compared_with_an_int_literal_is_decided_by_value() -> None:
    assert holds("double(args.amount) > 10000", amount=10000.5)
    assert not holds("double(args.amount) > 10000", amount=3)


def test_a_type_mismatch_the_checker_finds_still_fails_closed_at_run_time() -> None:
    with pytest.raises(ExpressionError, match="type mismatch"):
        holds("'a' + 1 == 'a1'")
