"""Which names an upstream MCP server gives its tools and prompts Writ can take.

MCP asks tool names to be 1 to 128 of `A-Z a-z 0-9 _ - .` with a SHOULD (2025-11-25, SEP-986; the
SDK's `mcp.shared.tool_name_validation` only warns), so upstreams in use have names outside it, and
the gateway warns of those (`gateway.calls.pipeline.TOOL_NAME`) rather than refusing them. Two kinds
are left out, since no SHOULD makes them safe: a name the store cannot hold (the call would fail on
PostgreSQL only after a read had run) and one with characters a person cannot see or that reorder
what they see (a bidi override, a zero-width space, a control), which would make the name an approver
or auditor reads differ from the one called. An upstream's words (descriptions and titles, of a tool
and inside its schemas) are kept, with such characters shown as code points.
"""

from __future__ import annotations

from typing import Any

from capabilities.contract import NAME_CHARS
from capabilities.hidden import LINE_BREAKS_KEPT, is_hidden, marked

_LOGGED_CHARS = 128


def name_problem(name: str, capability_id: str) -> str | None:
    """Why a tool or prompt shown as `name` under `capability_id` cannot be taken, or None when it can."""
    if not name:
        return "is empty"
    longest = max(len(name), len(capability_id))
    if longest > NAME_CHARS:
        return f"makes a name or id of {longest} characters, over the {NAME_CHARS} Writ can record"
    hidden = sorted({f"U+{ord(ch):04X}" for ch in name + capability_id if is_hidden(ch)})
    if hidden:
        return f"holds characters that are invisible or reorder text ({', '.join(hidden)})"
    return None


def logged(name: str) -> str:
    """`name` quoted for a log line: escaped, and cut short when long."""
    if len(name) <= _LOGGED_CHARS:
        return ascii(name)
    return f"{ascii(name[:_LOGGED_CHARS])}... ({len(name)} characters)"


def shown_text(text: str) -> str:
    """An upstream's description as Writ passes it on: hidden characters as `<U+XXXX>` (tab and
    newline kept), so a client shows a person what the model reads."""
    return marked(text, LINE_BREAKS_KEPT)


_WORDS = frozenset({"title", "description"})
# Values an argument is checked against or may take, not words about it: as the upstream gave them.
_VALUES = frozenset({"enum", "const", "default", "examples"})
# Their keys are property names or definition names, whatever they spell, and their values schemas.
_NAMED_SCHEMAS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})


def shown_schema(schema: Any) -> Any:
    """An upstream's JSON Schema as Writ passes it on: every `title` and `description` string in it as
    `shown_text`, anything a validator reads as it was."""
    if isinstance(schema, list):
        return [shown_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    shown: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _WORDS and isinstance(value, str):
            shown[key] = shown_text(value)
        elif key in _VALUES:
            shown[key] = value
        elif key in _NAMED_SCHEMAS and isinstance(value, dict):
            shown[key] = {name: shown_schema(each) for name, each in value.items()}
        else:
            shown[key] = shown_schema(value)
    return shown
