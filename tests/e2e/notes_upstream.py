"""An upstream MCP server with a real side effect (notes appended to a JSON file), over stdio or HTTP.

python notes_upstream.py NOTES_FILE            # stdio
python notes_upstream.py NOTES_FILE --http PORT

NOTES_ANSWER_DELAY_S=N makes `add_note` commit the note, then wait N seconds before answering (an
answer that arrives too late, so the caller cannot know whether the note was added).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import uvicorn
from mcp.server import Server
from mcp.server.stdio import stdio_server
from mcp.server.transport_security import TransportSecuritySettings

NOTES = Path(sys.argv[1])

TOOLS = [
    types.Tool(
        name="add_note",
        description="Append a note.",
        input_schema={
            "type": "object",
            "properties": {"text": {"type": "string", "minLength": 1}},
            "required": ["text"],
            "additionalProperties": False,
        },
    ),
    types.Tool(
        name="list_notes",
        description="Every note so far.",
        input_schema={"type": "object", "properties": {}},
        annotations=types.ToolAnnotations(read_only_hint=True),
    ),
    types.Tool(
        name="find_note_by_key",
        description="The notes added with this idempotency key.",
        input_schema={"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
        annotations=types.ToolAnnotations(read_only_hint=True),
    ),
]
ANSWER_DELAY_S = float(os.environ.get("NOTES_ANSWER_DELAY_S", "0"))


def load() -> list[dict[str, Any]]:
    return json.loads(NOTES.read_text()) if NOTES.exists() else []


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    notes = load()
    if params.name == "add_note":
        note = {
            "id": len(notes) + 1,
            "text": params.arguments["text"],
            "key": (params.meta or {}).get("writ/idempotencyKey"),
        }
        NOTES.write_text(json.dumps([*notes, note]))
        await anyio.sleep(ANSWER_DELAY_S)
        body: dict[str, Any] = note
    elif params.name == "find_note_by_key":
        body = {"notes": [note for note in notes if note["key"] == params.arguments["key"]]}
    else:
        body = {"notes": notes}
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=json.dumps(body))], structured_content=body
    )


server = Server("notes", on_list_tools=list_tools, on_call_tool=call_tool)


async def serve_stdio() -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    if "--http" in sys.argv:
        port = int(sys.argv[sys.argv.index("--http") + 1])
        app = server.streamable_http_app(
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False)
        )
        uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
    else:
        anyio.run(serve_stdio)
