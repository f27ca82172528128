"""Rule conditions in CEL (cel-python): compiled once when the policy loads, evaluated per call.

CEL is a small, side-effect-free language with no loops and no access to the host, which is why it
is safe to take from a config file. Nothing here ever hands a string to Python's `eval`.

Variables an expression sees:
    args        the concrete tool arguments (JSON -> CEL)
    principal   {subject, tenant, roles, scopes, groups, client_id}
    capability  {id, version, tool, effect, kind}: tool is a prompt's name for a prompt get
    context     {now (timestamp), run_call_count}
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import celpy
import lark
from celpy import celtypes
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError, base_functions

from .model import PolicyError, PolicyInput


@functools.cache
def _environment() -> celpy.Environment:
    # Building CEL's parser takes about 2 s of CPU: paid by the first rule compiled, not by every
    # `writ` command that imports this package (`writ token`, `writ calls show`, ...).
    return celpy.Environment()


VARIABLES = frozenset({"args", "principal", "capability", "context"})
_TYPE_NAMES = frozenset(
    {"int", "uint", "double", "bool", "string", "bytes", "list", "map", "null_type", "type"}
)
_MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})
_FUNCTIONS = (
    frozenset(name for name in base_functions if name[0] != "_" and name[-1] != "_") | _MACROS | {"has"}
)

# What cel-python raises for ordinary evaluation problems, plus the Python errors its built-ins let
# escape on odd input. These are the runtime failures a rule fails closed on.
_EVAL_ERRORS: tuple[type[BaseException], ...] = (
    CELEvalError,
    TypeError,
    ValueError,
    KeyError,
    IndexError,
    AttributeError,
    ArithmeticError,
    RecursionError,
)

_KINDS: dict[type[BaseException], str] = {
    KeyError: "missing field",
    TypeError: "type mismatch",
    ZeroDivisionError: "division by zero",
    ArithmeticError: "arithmetic error",
    IndexError: "index out of range",
    ValueError: "invalid value",
}


class ExpressionError(PolicyError):
    """A condition could not be evaluated for this call (missing field, type mismatch, ...).

    The message names the rule and the expression but not argument values, which may be redacted.
    """

    def __init__(self, rule_id: str, source: str, problem: str, *, kind: str = "rule") -> None:
        super().__init__(f"{kind} {rule_id!r}: cannot evaluate `{source}`: {problem}")
        self.rule_id = rule_id
        self.source = source
        self.problem = problem


Activation = dict[str, celtypes.Value]


@dataclass(frozen=True, slots=True)
class Condition:
    """A compiled `when` expression of one rule."""

    rule_id: str
    source: str
    _program: celpy.Runner = field(repr=False, compare=False)

    @classmethod
    def compile(cls, rule_id: str, source: str) -> Condition:
        """Parse and prepare `source` once.

        Raises:
            PolicyError: the expression is not valid CEL.
        """
        return cls(rule_id=rule_id, source=source, _program=_compile(f"rule {rule_id!r}: when", source))

    def holds(self, activation: Activation) -> bool:
        """True when the expression yields `true` for this call.

        Raises:
            ExpressionError: evaluation failed or yielded something other than a bool.
        """
        try:
            value = self._program.evaluate(activation)
        except _EVAL_ERRORS as exc:
            raise ExpressionError(self.rule_id, self.source, _problem(exc)) from exc
        if isinstance(value, CELEvalError):
            raise ExpressionError(self.rule_id, self.source, _problem(value))
        if not isinstance(value, celtypes.BoolType):
            raise ExpressionError(self.rule_id, self.source, f"yielded {type(value).__name__}, not a bool")
        return bool(value)


@dataclass(frozen=True, slots=True)
class ValueExpression:
    """A compiled expression of a budget that yields a value (an amount, a currency)."""

    budget_id: str
    field_name: str
    source: str
    _program: celpy.Runner = field(repr=False, compare=False)

    @classmethod
    def compile(cls, budget_id: str, field_name: str, source: str) -> ValueExpression:
        """Parse and prepare `source` once.

        Raises:
            PolicyError: the expression is not valid CEL.
        """
        program = _compile(f"budget {budget_id!r}: {field_name}", source)
        return cls(budget_id=budget_id, field_name=field_name, source=source, _program=program)

    def value(self, activation: Activation) -> celtypes.Value:
        """The expression's value for this call.

        Raises:
            ExpressionError: evaluation failed.
        """
        try:
            value = self._program.evaluate(activation)
        except _EVAL_ERRORS as exc:
            raise self.error(_problem(exc)) from exc
        if isinstance(value, CELEvalError):
            raise self.error(_problem(value))
        return value

    def error(self, problem: str) -> ExpressionError:
        return ExpressionError(self.budget_id, self.source, f"{self.field_name}: {problem}", kind="budget")


def _compile(label: str, source: str) -> celpy.Runner:
    try:
        environment = _environment()
        ast = environment.compile(source)
        program = environment.program(ast)
    except CELParseError as exc:
        detail = " ".join(str(exc).split())
        raise PolicyError(f"{label}: invalid CEL `{source}`: {detail}") from exc
    variables, functions = _unknown_names(ast)
    if variables:
        raise PolicyError(
            f"{label}: unknown variable {', '.join(map(repr, variables))} in `{source}`; "
            f"expressions may use {', '.join(sorted(VARIABLES))}"
        )
    if functions:
        raise PolicyError(f"{label}: unknown function {', '.join(map(repr, functions))} in `{source}`")
    return program


def activation_for(inp: PolicyInput) -> Activation:
    """The CEL variables for one call.

    Raises:
        ValueError: an argument has no CEL equivalent (callers treat this as an evaluation failure).
    """
    cap = inp.capability
    now = inp.context.now if inp.context.now.tzinfo else inp.context.now.replace(tzinfo=UTC)
    return {
        "args": to_cel(dict(inp.arguments)),
        "principal": to_cel(inp.principal.to_json()),
        "capability": to_cel(
            {
                "id": cap.id,
                "version": cap.version,
                "tool": cap.tool_name,
                "effect": cap.effect,
                "kind": cap.kind,
            }
        ),
        "context": to_cel({"now": now, "run_call_count": inp.context.run_call_count}),
    }


def to_cel(value: Any) -> celtypes.Value:
    """JSON-shaped Python data (plus datetimes and timedeltas) as CEL values.

    Raises:
        ValueError: a value has no CEL equivalent, or an integer is outside CEL's 64-bit range.
    """
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
        case datetime():
            return celtypes.TimestampType(value)
        case timedelta():
            return celtypes.DurationType(value)
        case Mapping():
            return celtypes.MapType({celtypes.StringType(str(k)): to_cel(v) for k, v in value.items()})
        case list() | tuple():
            return celtypes.ListType([to_cel(item) for item in value])
        case _:
            raise ValueError(f"{type(value).__name__} has no CEL equivalent")


def _unknown_names(ast: lark.Tree[lark.Token]) -> tuple[list[str], list[str]]:
    """Variables the expression reads that neither Writ nor its own macros bind, and functions CEL lacks.

    Checked at load so a typo such as `arg.amount` or `args.name.startswith(...)` fails there
    instead of denying every call at runtime.
    """
    used: set[str] = set()
    bound: set[str] = set()
    called: set[str] = set()
    for node in ast.iter_subtrees():
        if node.data == "ident":
            used.update(str(token) for token in node.children)
        elif node.data == "ident_arg" and node.children:
            called.add(str(node.children[0]))
        elif node.data == "member_dot_arg" and len(node.children) >= 2:
            method = str(node.children[1])
            called.add(method)
            exprlist = node.children[2] if len(node.children) > 2 else None
            if method in _MACROS and isinstance(exprlist, lark.Tree) and exprlist.children:
                first = exprlist.children[0]
                if isinstance(first, lark.Tree):
                    bound.update(
                        str(token)
                        for sub in first.iter_subtrees()
                        if sub.data == "ident"
                        for token in sub.children
                    )
    variables = used - bound - VARIABLES - _TYPE_NAMES
    functions = called - _FUNCTIONS
    return sorted(variables), sorted(functions)


def _problem(exc: BaseException) -> str:
    """A short description of what went wrong, without echoing argument values."""
    cause: type[BaseException] | None = type(exc)
    if isinstance(exc, CELEvalError):
        cause = exc.args[1] if len(exc.args) > 1 and isinstance(exc.args[1], type) else None
        text = exc.args[0] if exc.args and isinstance(exc.args[0], str) else ""
        if cause is KeyError and text.startswith("no such member"):
            # "no such member in mapping: 'amount'" names a field, never a value; other texts may
            # quote the whole activation, so they are not repeated.
            return f"missing field ({text}); guard it with has(...)"
    if cause is None:
        return "evaluation error"
    for kind, text in _KINDS.items():
        if issubclass(cause, kind):
            return text
    return "evaluation error"
