"""The CEL runtime Writ decides with (cel-expr-python) against the one it replaced (cel-python).

A change of engine must not loosen a decision: over the expressions a policy writes (comparisons,
membership, `has`, macros, string functions, arithmetic) and arguments of every JSON shape, wherever
both engines give an answer it is the same answer, and the new engine answers where the old one
could not (the rule failed closed) only where the CEL specification defines what cel-python lacks:
an argument meeting a literal of another type (`==` across types is false, `args.amount > 10.5`
compares an integer amount as a number). The new engine may
fail closed where cel-python answered, which is stricter, never looser. cel-python takes a JSON
`true` or `false` for the numbers 1 and 0 (`false > 100` is false, `false != 0` is false): CEL has no
such overload for `>` (the new engine fails closed) and a bool never equals a number (`!=` is true).
"""

from __future__ import annotations

import re
from typing import Any

import celpy
import pytest
from celpy import celtypes
from hypothesis import given, settings
from hypothesis import strategies as st

from policy.cel import Condition, ExpressionError, activation_for

from .helpers import call

EXPRESSIONS = (
    "args.amount > 100",
    "args.amount >= 100 && args.amount <= 10000",
    "args.amount > 10.5",
    "double(args.amount) > 10000",
    "double(args.amount) > 100.0",
    "args.amount == 100",
    "args.amount != 0",
    "args.amount / 2 > 10",
    "args.amount % 7 == 1",
    "args.amount + 1 > 2",
    "-args.amount < 0",
    "has(args.amount) && args.amount > 5000",
    "!has(args.amount) || args.amount < 50",
    "args.currency == 'EUR'",
    "args.currency in ['EUR', 'USD']",
    "args.currency.startsWith('E')",
    "args.currency.endsWith('R')",
    "args.currency.contains('U')",
    "args.currency.matches('^[A-Z]{3}$')",
    "size(args.currency) == 3",
    "args.note.size() > 4",
    "args.tags.exists(t, t == 'urgent')",
    "args.tags.all(t, size(t) < 6)",
    "args.tags.exists_one(t, t.startsWith('a'))",
    "size(args.tags.filter(t, t != 'x')) > 1",
    "'urgent' in args.tags",
    "args.lines.exists(l, l.qty > 2)",
    "args.lines.map(l, l.qty).all(q, q > 0)",
    "args.flag",
    "args.flag == true",
    "args.flag && principal.tenant == 'acme'",
    "type(args.amount) == int",
    "type(args.amount) == double",
    "args.amount",
    "principal.tenant == 'acme' && 'agent' in principal.roles",
    "capability.effect == 'write'",
    "context.run_call_count > 2",
)

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**40), max_value=2**40)
    | st.floats(allow_nan=False, allow_infinity=False, width=32)
    | st.sampled_from(["EUR", "USD", "eur", "", "abc", "urgent", "a", "x"])
)
arguments = st.fixed_dictionaries(
    {},
    optional={
        "amount": json_scalars,
        "currency": json_scalars,
        "note": json_scalars,
        "flag": json_scalars,
        "tags": st.lists(st.sampled_from(["urgent", "a", "ab", "x", "longtag"]), max_size=4) | json_scalars,
        "lines": st.lists(st.fixed_dictionaries({"qty": st.integers(-3, 5)}), max_size=3) | json_scalars,
    },
)

_OLD = celpy.Environment()
_OLD_PROGRAMS = {source: _OLD.program(_OLD.compile(source)) for source in EXPRESSIONS}
_NEW = {source: Condition.compile("r", source) for source in EXPRESSIONS}


def _old(source: str, args: dict[str, Any]) -> bool | None:
    """cel-python's verdict: True or False, or None where it could not decide (the rule fails closed)."""
    inp = call(**args)
    activation = {
        "args": _to_old(args),
        "principal": _to_old(inp.principal.to_json()),
        "capability": _to_old({"effect": inp.capability.effect}),
        "context": _to_old({"run_call_count": inp.context.run_call_count}),
    }
    try:
        value = _OLD_PROGRAMS[source].evaluate(activation)
    except Exception:  # every failure of the old engine is a rule failing closed
        return None
    return bool(value) if isinstance(value, celtypes.BoolType) else None


def _new(source: str, args: dict[str, Any]) -> bool | None:
    try:
        return _NEW[source].holds(activation_for(call(**args)))
    except ExpressionError:
        return None


def _to_old(value: Any) -> Any:
    match value:
        case None:
            return None
        case bool():
            return celtypes.BoolType(value)
        case int():
            return celtypes.IntType(value)
        case float():
            return celtypes.DoubleType(value)
        case str():
            return celtypes.StringType(value)
        case dict():
            return celtypes.MapType({celtypes.StringType(k): _to_old(v) for k, v in value.items()})
        case list():
            return celtypes.ListType([_to_old(v) for v in value])
    raise AssertionError(value)


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "double" if isinstance(value, float) else "int"
    return {str: "string", type(None): "null"}.get(type(value), "other")


def _literal_kind(source: str) -> str | None:
    if re.search(r"\b(true|false)\b", source):
        return "bool"
    if "'" in source:
        return "string"
    if re.search(r"\b\d+\.\d+\b", source):
        return "double"
    if re.search(r"\b\d+\b", source):
        return "int"
    return None


def _specified(source: str, args: dict[str, Any]) -> bool:
    """True where the specification decides and cel-python has no overload: the argument is of another
    type than the literal it meets (`==` across types is false, an int compares with a double)."""
    field = re.search(r"args\.(\w+)", source)
    literal = _literal_kind(source)
    if field is None or literal is None or field.group(1) not in args:
        return False
    return _kind(args[field.group(1)]) != literal


def _bool_as_number(source: str, args: dict[str, Any]) -> bool:
    """cel-python's one wrong answer: a JSON boolean meeting a number is taken as 0 or 1."""
    field = re.search(r"args\.(\w+)", source)
    value = args.get(field.group(1)) if field else None
    return isinstance(value, bool) and _literal_kind(source) in {"int", "double"}


@pytest.mark.parametrize("source", EXPRESSIONS)
@settings(max_examples=60, deadline=None)
@given(args=arguments)
def test_both_engines_decide_alike(source: str, args: dict[str, Any]) -> None:
    old, new = _old(source, args), _new(source, args)
    if old is not None and new is not None and new != old:
        assert _bool_as_number(source, args), f"{source} with {args}: cel-python {old}, cel-expr-python {new}"
    elif old is None and new is not None:
        assert _specified(source, args), f"{source} with {args}: only cel-expr-python decided ({new})"


def test_the_new_engine_decides_an_int_against_a_double_as_the_specification_does() -> None:
    args = {"amount": 11}
    assert _old("args.amount > 10.5", args) is None
    assert _new("args.amount > 10.5", args) is True


def test_the_new_engine_fails_closed_on_a_boolean_taken_for_a_number() -> None:
    args = {"amount": False}
    assert _old("args.amount > 100", args) is False
    assert _new("args.amount > 100", args) is None
