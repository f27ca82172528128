"""Which names an upstream MCP server gives its tools and prompts Writ can take.

MCP asks tool names to be 1 to 128 of `A-Z a-z 0-9 _ - .` with a SHOULD (2025-11-25, SEP-986; the
SDK's `mcp.shared.tool_name_validation` only warns), so upstreams in use have names outside it, and
the gateway warns of those (`gateway.calls.pipeline.TOOL_NAME`) rather than refusing them. Two kinds
are left out, since no SHOULD makes them safe: a name the store cannot hold (the call would fail on
PostgreSQL only after a read had run) and one with characters a person cannot see or that reorder
what they see (a bidi override, a zero-width space, a control), which would make the name an approver
or auditor reads differ from the one called.
"""

from __future__ import annotations

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
