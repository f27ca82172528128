"""The reason-code catalogue is complete: every code Writ can emit is a member, and every member is
emitted; the HTTP status of each comes from the one table; the README lists exactly the catalogue."""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from pathlib import Path

from gateway.reasons import HTTP_STATUS, ReasonCode, http_status

ROOT = Path(__file__).resolve().parents[2]
EMITTERS = ("gateway", "policy", "store")

FREE_TEXT = {"withdrawn by the requester (tasks/cancel)"}
"""Reasons that are a person's words, not codes: the rejection a task's cancellation records."""

CODE_FIRST = {"Refused", "Refusal"}
"""Callables whose first argument is a reason code."""
CODE_SECOND = {"_escalate"}
"""Callables whose second argument is a reason code."""


def literals(node: ast.expr, constants: dict[str, str]) -> Iterator[str]:
    """The strings an expression in a reason's place can evaluate to, as far as the source says."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.value
    elif isinstance(node, ast.Name) and node.id in constants:
        yield constants[node.id]
    elif isinstance(node, ast.IfExp):
        yield from literals(node.body, constants)
        yield from literals(node.orelse, constants)
    elif isinstance(node, ast.BoolOp):
        for value in node.values:
            yield from literals(value, constants)
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "str":
        yield from literals(node.args[0], constants)


def callee(node: ast.Call) -> str:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def reasons_in(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """Every literal reason a module emits: `reason=`, `"reason":`, `reason = `, and refusals' codes."""
    constants = {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        for target in node.targets
        if isinstance(target, ast.Name) and isinstance(node.value.value, str)
    }
    for node in ast.walk(tree):
        places: list[ast.expr] = []
        if isinstance(node, ast.Call):
            places += [k.value for k in node.keywords if k.arg == "reason"]
            if callee(node) in CODE_FIRST and node.args:
                places.append(node.args[0])
            if callee(node) in CODE_SECOND and len(node.args) > 1:
                places.append(node.args[1])
        elif isinstance(node, ast.Dict):
            places += [v for k, v in zip(node.keys, node.values, strict=True) if _is(k, "reason")]
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "reason" for t in node.targets
        ):
            places.append(node.value)
        for place in places:
            yield from ((node.lineno, value) for value in literals(place, constants))


def _is(node: ast.expr | None, text: str) -> bool:
    return isinstance(node, ast.Constant) and node.value == text


@functools.cache
def sources() -> tuple[tuple[Path, ast.Module], ...]:
    """Every module of the emitting packages, parsed once for all the cases (which only read the trees)."""
    return tuple(
        (path, ast.parse(path.read_text(), filename=str(path)))
        for package in EMITTERS
        for path in sorted((ROOT / package).rglob("*.py"))
    )


def test_every_literal_reason_in_the_tree_is_a_catalogued_code() -> None:
    unknown = [
        f"{path.relative_to(ROOT)}:{line}: {value!r}"
        for path, tree in sources()
        for line, value in reasons_in(tree)
        if value not in ReasonCode.__members__.values() and value not in FREE_TEXT
    ]
    assert not unknown, "reasons missing from gateway.reasons.ReasonCode:\n" + "\n".join(unknown)


def test_every_catalogued_code_is_emitted_somewhere() -> None:
    emitted = {value for _, tree in sources() for _, value in reasons_in(tree)}
    emitted |= {
        ReasonCode[node.attr]
        for _, tree in sources()
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "ReasonCode"
        and node.attr in ReasonCode.__members__
    }
    assert set(ReasonCode) - emitted == set()


def test_the_http_status_of_a_code_comes_from_the_one_table() -> None:
    assert set(HTTP_STATUS) <= set(ReasonCode)
    assert http_status(ReasonCode.NOT_FOUND) == 404
    assert http_status(ReasonCode.SELF_APPROVAL_FORBIDDEN) == 403
    # A policy author's own reason refuses the act itself.
    assert http_status("amount_over_limit") == 403


def test_the_readme_lists_exactly_the_catalogue() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("<!-- reason codes -->")[1].split("<!-- /reason codes -->")[0]
    listed = re.findall(r"^\| `([a-z_]+)` \|", section, flags=re.MULTILINE)
    assert listed == [code.value for code in ReasonCode]
