"""Rule conditions in CEL (cel-expr-python, the CEL project's C++ runtime): compiled and type-checked
once when the policy loads, evaluated per call.

CEL is a small, side-effect-free language with no loops and no access to the host, which is why it
is safe to take from a config file. Nothing here ever hands a string to Python's `eval`.

Variables an expression sees:
    args        the concrete tool arguments (JSON -> CEL)
    principal   {subject, tenant, roles, scopes, groups, client_id}
    capability  {id, version, tool, effect, kind}: tool is a prompt's name for a prompt get
    context     context.now (a timestamp), context.run_call_count (an int)

The checker refuses at load any variable, `context` field or function the environment does not
declare, so a typo such as `arg.amount` or `args.name.startswith(...)` fails there instead of
denying every call at runtime. An evaluation error (a missing field, a type mismatch, a division by
zero) is a value, not an exception: the rule fails closed with a short description of the problem
that never quotes argument values.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import cel_expr_python.cel as cel

from .model import PolicyError, PolicyInput

_T = cel.Type
_ARGUMENTS_KEYS = ("args", "principal", "capability")
VARIABLES = frozenset({*_ARGUMENTS_KEYS, "context"})

RUN_CALL_COUNT = "context.run_call_count"

# CEL's integers are 64-bit: a larger JSON number has no CEL equivalent (the call fails closed).
_INT_MIN, _INT_MAX = -(2**63), 2**63 - 1


@functools.cache
def _environment() -> cel.Env:
    variables = {name: _T.Map(_T.STRING, _T.DYN) for name in _ARGUMENTS_KEYS}
    # `context` is two typed variables under one qualified name: `context.now` is a timestamp (CEL's
    # runtime takes datetimes only as top-level values), and an unknown `context.x` fails at load.
    variables["context.now"] = _T.TIMESTAMP
    variables[RUN_CALL_COUNT] = _T.INT
    return cel.NewEnv(variables=variables)


class ExpressionError(PolicyError):
    """A condition could not be evaluated for this call (missing field, type mismatch, ...).

    The message names the rule and the expression but not argument values, which may be redacted.
    """

    def __init__(self, rule_id: str, source: str, problem: str, *, kind: str = "rule") -> None:
        super().__init__(f"{kind} {rule_id!r}: cannot evaluate `{source}`: {problem}")
        self.rule_id = rule_id
        self.source = source
        self.problem = problem


class Activation:
    """The CEL variables of one call, converted once and shared by every expression of the policy."""

    __slots__ = ("_activation",)

    def __init__(self, data: Mapping[str, Any]) -> None:
        self._activation = _environment().Activation(dict(data))

    def evaluate(self, program: cel.Expression) -> cel.Value:
        return program.eval(self._activation)


@dataclass(frozen=True, slots=True)
class Condition:
    """A compiled `when` expression of one rule."""

    rule_id: str
    source: str
    _program: cel.Expression = field(repr=False, compare=False)

    @classmethod
    def compile(cls, rule_id: str, source: str) -> Condition:
        """Parse, check and prepare `source` once.

        Raises:
            PolicyError: the expression is not valid CEL, or names something the environment lacks.
        """
        return cls(rule_id=rule_id, source=source, _program=_compile(f"rule {rule_id!r}: when", source))

    def holds(self, activation: Activation) -> bool:
        """True when the expression yields `true` for this call.

        Raises:
            ExpressionError: evaluation failed or yielded something other than a bool.
        """
        value = _evaluated(activation, self._program, self.source)
        if isinstance(value, _Failure):
            raise ExpressionError(self.rule_id, self.source, value.problem)
        if not isinstance(value, bool):
            raise ExpressionError(self.rule_id, self.source, f"yielded {type_name(value)}, not a bool")
        return value


@dataclass(frozen=True, slots=True)
class ValueExpression:
    """A compiled expression of a budget that yields a value (an amount, a currency)."""

    budget_id: str
    field_name: str
    source: str
    _program: cel.Expression = field(repr=False, compare=False)

    @classmethod
    def compile(cls, budget_id: str, field_name: str, source: str) -> ValueExpression:
        """Parse, check and prepare `source` once.

        Raises:
            PolicyError: the expression is not valid CEL, or names something the environment lacks.
        """
        program = _compile(f"budget {budget_id!r}: {field_name}", source)
        return cls(budget_id=budget_id, field_name=field_name, source=source, _program=program)

    def value(self, activation: Activation) -> Any:
        """The expression's value for this call, as plain Python (int, float, str, bool, ...).

        Raises:
            ExpressionError: evaluation failed.
        """
        value = _evaluated(activation, self._program, self.source)
        if isinstance(value, _Failure):
            raise self.error(value.problem)
        return value

    def error(self, problem: str) -> ExpressionError:
        return ExpressionError(self.budget_id, self.source, f"{self.field_name}: {problem}", kind="budget")


@dataclass(frozen=True, slots=True)
class _Failure:
    problem: str


def _evaluated(activation: Activation, program: cel.Expression, source: str) -> Any:
    try:
        result = activation.evaluate(program)
    except RuntimeError as exc:  # the runtime refuses the activation itself (a value it cannot hold)
        return _Failure(_problem(str(exc), source))
    if result.type() == _T.ERROR:
        return _Failure(_problem(str(result.value()), source))
    return result.plain_value()


# "ERROR: <input>:1:21: undeclared reference to 'startswith' (in container '')"
_CHECK_ERROR = re.compile(r"ERROR: <input>:(\d+):(\d+): (.*)")
_UNDECLARED = re.compile(r"undeclared reference to '([^']+)'")


def _compile(label: str, source: str) -> cel.Expression:
    environment = _environment()
    try:
        return environment.compile(source)
    except RuntimeError as exc:
        text = str(exc)
    messages = [message for _, _, message in _CHECK_ERROR.findall(text)]
    if messages and all(_OVERLOAD.search(message) for message in messages):
        # The checker finds no overload where only the runtime knows the types: `double(args.amount) >
        # 10000` compares a double with an int, which CEL's runtime does by value. Every name was
        # checked (an undeclared one is another message); the types are left to the evaluation, where a
        # real mismatch fails the rule closed, as it always did.
        return environment.compile(source, disable_check=True)
    raise PolicyError(f"{label}: {_compile_problem(source, text)}")


_OVERLOAD = re.compile(r"^found no matching overload for ")


def _compile_problem(source: str, text: str) -> str:
    """What the checker found, said the way a policy author can act on."""
    variables: list[str] = []
    functions: list[str] = []
    lines = source.splitlines() or [""]
    for line_no, column, message in _CHECK_ERROR.findall(text):
        undeclared = _UNDECLARED.search(message)
        if undeclared is None:
            continue
        name = undeclared.group(1)
        line = lines[int(line_no) - 1] if int(line_no) <= len(lines) else ""
        at = int(column) - 1
        # The checker points a function call at its `(`, and a variable (or a select on one) at the
        # name or the `.` that follows it.
        if 0 <= at < len(line) and line[at] == "(":
            functions.append(name.rsplit(".", 1)[-1])
        else:
            variables.append(name.split(".", 1)[0] if not name.startswith("context.") else name)
    if variables:
        return (
            f"unknown variable {', '.join(map(repr, dict.fromkeys(variables)))} in `{source}`; "
            "expressions may use args, capability, context.now, context.run_call_count, principal"
        )
    if functions:
        return f"unknown function {', '.join(map(repr, dict.fromkeys(functions)))} in `{source}`"
    messages = [" ".join(message.split()) for _, _, message in _CHECK_ERROR.findall(text)]
    detail = "; ".join(messages) if messages else " ".join(text.split())
    return f"invalid CEL `{source}`: {detail}"


def activation_for(inp: PolicyInput) -> Activation:
    """The CEL variables for one call.

    Raises:
        ValueError: an argument has no CEL equivalent (callers treat this as an evaluation failure).
    """
    cap = inp.capability
    now = inp.context.now if inp.context.now.tzinfo else inp.context.now.replace(tzinfo=UTC)
    return Activation(
        {
            "args": to_cel(dict(inp.arguments)),
            "principal": to_cel(inp.principal.to_json()),
            "capability": {
                "id": cap.id,
                "version": cap.version,
                "tool": cap.tool_name,
                "effect": cap.effect,
                "kind": cap.kind,
            },
            "context.now": now,
            "context.run_call_count": inp.context.run_call_count,
        }
    )


def to_cel(value: Any) -> Any:
    """JSON-shaped Python data, checked to have a CEL equivalent (lists for tuples, string keys).

    Raises:
        ValueError: a value has no CEL equivalent, or an integer is outside CEL's 64-bit range.
    """
    match value:
        case None | bool() | float() | str():
            return value
        case int():
            if not _INT_MIN <= value <= _INT_MAX:
                raise ValueError("an integer outside CEL's 64-bit range")
            return value
        case Mapping():
            return {str(k): to_cel(v) for k, v in value.items()}
        case list() | tuple():
            return [to_cel(item) for item in value]
        case _:
            raise ValueError(f"{type(value).__name__} has no CEL equivalent")


def type_name(value: Any) -> str:
    names = {bool: "bool", int: "int", float: "double", str: "string", bytes: "bytes", list: "list"}
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "map"
    if isinstance(value, datetime):
        return "timestamp"
    return names.get(type(value), type(value).__name__)


_PROBLEMS = (
    ("Key not found in map", "missing field"),
    ("No such key", "missing field"),
    ("No matching overloads", "type mismatch"),
    ("no such overload", "type mismatch"),
    ("divide by zero", "division by zero"),
    ("modulus by zero", "division by zero"),
    ("overflow", "arithmetic error"),
    ("out of range", "index out of range"),
    ("index", "index out of range"),
)
_MISSING_KEY = re.compile(r'Key not found in map : "([^"]{1,128})"')


def _problem(text: str, source: str) -> str:
    """A short description of what went wrong, without echoing argument values.

    The runtime's texts may quote the activation: a missing key's name is repeated only when the
    expression itself spells it (`args.amount`), never when it was computed from the arguments.
    """
    missing = _MISSING_KEY.search(text)
    if missing is not None:
        key = missing.group(1)
        named = f" ({key!r})" if re.search(rf"\.{re.escape(key)}\b", source) else ""
        return f"missing field{named}; guard it with has(...)"
    lowered = text.lower()
    for needle, kind in _PROBLEMS:
        if needle.lower() in lowered:
            return kind
    return "evaluation error"
