"""Building `ToolResult`s from plain values, shared by the HTTP and Python executors."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Collection, Mapping
from typing import Any

from capabilities.contract import Invocation, Outcome, ToolResult

_NO_VALUE = object()


def compact_json(value: Any) -> str:
    """JSON without spaces; values JSON cannot hold are rendered with str()."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)


def text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def json_result(value: Any, *, is_error: bool = False) -> ToolResult:
    """Compact JSON in one text block; `structured` is the value if an object, else {"result": value}."""
    structured = dict(value) if isinstance(value, Mapping) else {"result": value}
    return ToolResult(content=(text_block(compact_json(value)),), structured=structured, is_error=is_error)


def text_result(text: str, *, is_error: bool = False) -> ToolResult:
    return ToolResult(content=(text_block(text),), is_error=is_error)


def value_result(value: Any) -> ToolResult:
    """What a Python callable returned, as a tool result (a ToolResult passes through unchanged).

    Python values JSON cannot hold (datetimes, Decimals, UUIDs, sets, NaN, ...) are given as their
    `str()`, so the result can be recorded, hashed and sent like any other.
    """
    if isinstance(value, ToolResult):
        return value
    if isinstance(value, str):
        return text_result(_well_formed(value))
    plain = plain_json(value)
    if isinstance(plain, Mapping):
        return json_result(plain)
    return ToolResult(content=(text_block(compact_json(plain)),))


def is_json(value: Any) -> bool:
    """Whether `value` can be written as strict JSON in UTF-8 (RFC 8259 has no NaN or Infinity, and
    a lone surrogate such as the one `"\\ud800"` parses to has no UTF-8 form, so it cannot be stored)."""
    try:
        json.dumps(value, allow_nan=False, ensure_ascii=False).encode("utf-8")
    except (ValueError, TypeError, RecursionError):  # UnicodeEncodeError is a ValueError
        return False
    return True


def _well_formed(text: str) -> str:
    """`text`, with each lone surrogate (no UTF-8 form: it cannot be hashed or stored) as `\\udXXX`."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def _text_of(value: Any) -> str:
    try:
        return _well_formed(str(value))
    except RecursionError:  # the repr of a structure nested thousands deep
        return f"<{type(value).__name__} nested too deep to show>"


def plain_json(value: Any, depth: int = 0) -> Any:
    """`value` as strict JSON data (RFC 8259): anything else becomes its `str()`.

    Mapping keys become strings, tuples and sets lists (sets sorted by their text), non-finite
    floats their name, and containers nested past `_MAX_PLAIN_DEPTH` their text.
    """
    match value:
        case None | bool() | int():
            return value
        case str():
            return _well_formed(value)
        case float():
            return value if math.isfinite(value) else str(value)
        case Mapping() if depth < _MAX_PLAIN_DEPTH:
            return {_text_of(key): plain_json(item, depth + 1) for key, item in value.items()}
        case list() | tuple() if depth < _MAX_PLAIN_DEPTH:
            return [plain_json(item, depth + 1) for item in value]
        case set() | frozenset() if depth < _MAX_PLAIN_DEPTH:
            return sorted((plain_json(item, depth + 1) for item in value), key=str)
        case _:
            return _text_of(value)


_MAX_PLAIN_DEPTH = 64


def parse_json(text: str) -> Any:
    """The JSON value in `text`, or `_NO_VALUE` when it is not JSON.

    Strict RFC 8259: `NaN`, `Infinity` and numbers too large for a float are not JSON (Python's
    parser takes them, and they would then be written out as invalid JSON), and nesting too deep
    to parse, or deeper than 64 levels of arrays and objects, is not a value either (Python's parser
    takes several hundred; the log's event serializer and MCP clients do not); nor is a lone
    surrogate escape (`"\\ud800"`), which parses to a string with no UTF-8 form.
    """
    try:
        value = json.loads(text, parse_constant=_not_json, parse_float=_finite_float)
    except (ValueError, RecursionError):
        return _NO_VALUE
    # Parsed, but the log's serializer (about 255 levels) and clients refuse it. Every HTTP answer comes
    # here: only text with more openers than the limit can nest past it, so most are never walked.
    if text.count("{") + text.count("[") > _MAX_PLAIN_DEPTH and deeper_than(value, _MAX_PLAIN_DEPTH):
        return _NO_VALUE
    if _SURROGATE_ESCAPE.search(text) and not is_json(value):
        return _NO_VALUE  # a lone surrogate escape: kept as the text it came as, which is well formed
    return value


def deeper_than(value: Any, limit: int) -> bool:
    """Whether the JSON `value` nests arrays and objects more than `limit` levels deep (found without
    recursing: a value may be nested deeper than Python's recursion limit allows reading it)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth >= limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} does not fit a float")
    return value


def is_value(value: Any) -> bool:
    return value is not _NO_VALUE


def mentions(value: Any, needles: Collection[str]) -> bool:
    """Whether the JSON `value` holds one of `needles` as a whole string, at any depth."""
    if isinstance(value, str):
        return value in needles
    if isinstance(value, Mapping):
        return any(mentions(v, needles) for v in value.values())
    if isinstance(value, list | tuple):
        return any(mentions(v, needles) for v in value)
    return False


WRIT_DISPATCH_ID = re.compile(r"(?:req|tc)_[0-9a-f]{28}")
"""An external request id or tool call id as Writ mints them (`gateway.calls.actions.new_id`)."""


def names_another(value: Any, ids: Collection[str]) -> bool:
    """Whether the JSON `value` names a dispatch of Writ's other than `ids`: a whole string in the
    form of Writ's request and tool call ids that is not one of them, at any depth."""
    if isinstance(value, str):
        return value not in ids and WRIT_DISPATCH_ID.fullmatch(value) is not None
    if isinstance(value, Mapping):
        return any(names_another(v, ids) for v in value.values())
    if isinstance(value, list | tuple):
        return any(names_another(v, ids) for v in value)
    return False


def failed_outcome(invocation: Invocation, error: str, detail: str) -> Outcome:
    """Definitely not performed (or a read): `failed`, with the detail as an error result."""
    return Outcome(
        "failed",
        text_result(detail, is_error=True),
        error=error,
        detail=detail,
        external_request_id=invocation.external_request_id,
    )


def unanswered_outcome(invocation: Invocation, read_only: bool, error: str, detail: str) -> Outcome:
    """Sent and not answered: `unknown` for anything with an effect, since the backend may have acted."""
    if read_only:
        return failed_outcome(invocation, error, detail)
    return Outcome("unknown", error=error, detail=detail, external_request_id=invocation.external_request_id)
