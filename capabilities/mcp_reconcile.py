"""Looking up an earlier call through another upstream MCP tool (`reconcile: {tool, arguments}`).

Building the lookup's arguments from templates, and reading its answer as a verdict: an error says
nothing; a record (a non-empty object or list, or `found: true`) says the effect happened; nothing
(an empty list, `found: false`, null) says it did not.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from typing import Any

from capabilities.config import McpReconcile
from capabilities.contract import Invocation, ReconcileResult, ToolResult
from capabilities.results import compact_json, is_value, lookup_found, parse_json


class MissingField(KeyError):
    """A template names a value the call did not provide."""


def lookup_arguments(setting: McpReconcile, invocation: Invocation) -> dict[str, Any]:
    """The lookup tool's arguments, templates filled from the call.

    Raises:
        MissingField: a template names a value the call does not have.
    """
    values = {
        **invocation.arguments,
        "idempotency_key": invocation.idempotency_key,
        "external_request_id": invocation.external_request_id,
        "tool_call_id": invocation.tool_call_id,
    }
    return {
        name: _fill(value, values) if isinstance(value, str) else value
        for name, value in setting.arguments.items()
    }


def _fill(template: str, values: Mapping[str, Any]) -> Any:
    parsed = list(string.Formatter().parse(template))
    if len(parsed) == 1 and parsed[0][0] == "" and parsed[0][1]:
        return _value(parsed[0][1], values)  # exactly one field: keep the value's type
    out: list[str] = []
    for literal, name, _, _ in parsed:
        out.append(literal)
        if name is not None:
            value = _value(name, values)
            out.append(value if isinstance(value, str) else compact_json(value))
    return "".join(out)


def _value(name: str, values: Mapping[str, Any]) -> Any:
    if values.get(name) is None:
        raise MissingField(name)
    return values[name]


def verdict(result: ToolResult, evidence: Mapping[str, Any], invocation: Invocation) -> ReconcileResult:
    """What the lookup tool's result says about the earlier call `invocation`."""
    evidence = dict(evidence)
    if result.is_error:
        return ReconcileResult("inconclusive", evidence={**evidence, "error": "lookup_tool_error"})
    body: Any = result.structured
    if body is None:
        body = _text_json(result)
        if not is_value(body):
            return ReconcileResult("inconclusive", evidence={**evidence, "error": "unreadable_lookup"})
    if isinstance(body, Mapping) and isinstance(body.get("found"), bool):
        found = body["found"]
        record = {k: v for k, v in body.items() if k != "found"}
        if not found:
            return ReconcileResult("not_found", evidence={**evidence, "found": False})
        return lookup_found(_only_value(record), invocation, {**evidence, "found": True})
    body = _only_value(body)
    if body is None or body == [] or body == {}:
        return ReconcileResult("not_found", evidence=evidence)
    if isinstance(body, list | Mapping):
        return lookup_found(body if isinstance(body, list) else dict(body), invocation, evidence)
    return ReconcileResult("inconclusive", evidence={**evidence, "error": "unreadable_lookup"})


def _only_value(body: Any) -> Any:
    """An envelope's only value (`{"notes": [...]}`, `{"result": null}`), else the body itself."""
    if isinstance(body, Mapping) and len(body) == 1:
        (value,) = body.values()
        if value is None or isinstance(value, list | Mapping):
            return value
    return body


def _text_json(result: ToolResult) -> Any:
    for block in result.content:
        if block.get("type") == "text":
            return parse_json(str(block.get("text", "")))
    return None
