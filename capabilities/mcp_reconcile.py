"""Looking up an earlier call through another upstream MCP tool (`reconcile: {tool, arguments}`).

Building the lookup's arguments from templates, and taking its result to the one reader of lookup
answers (`capabilities.lookups`): a tool error, or a result with no JSON, says nothing.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from typing import Any

from capabilities.config import McpReconcile
from capabilities.contract import Invocation, ReconcileResult, ToolResult
from capabilities.lookups import read_answer
from capabilities.results import compact_json, is_value, parse_json


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


def verdict(
    result: ToolResult, setting: McpReconcile, evidence: Mapping[str, Any], invocation: Invocation
) -> ReconcileResult:
    """What the lookup tool's result says about the earlier call `invocation`: a tool error or an
    answer that is not JSON says nothing; any other is read as the lookup's `setting` says."""
    evidence = dict(evidence)
    if result.is_error:
        return ReconcileResult("inconclusive", evidence={**evidence, "error": "lookup_tool_error"})
    body: Any = result.structured
    if body is None:
        # No text block at all is no answer either (an empty string is not JSON).
        body = parse_json(_first_text(result) or "")
        if not is_value(body):
            return ReconcileResult("inconclusive", evidence={**evidence, "error": "unreadable_lookup"})
    return read_answer(body, setting, invocation, evidence)


def _first_text(result: ToolResult) -> str | None:
    for block in result.content:
        if block.get("type") == "text":
            return str(block.get("text", ""))
    return None
