"""An upstream MCP server over stdio, run as a subprocess by the tests.

It refuses to start unless the file named by GATE_FILE exists; `crash` removes that file and exits
the process, so the tests can kill a session and control whether it can be reopened.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp_types
from mcp.server import Server
from mcp.server.stdio import stdio_server


async def list_tools(ctx: Any, params: Any) -> mcp_types.ListToolsResult:
    return mcp_types.ListToolsResult(
        tools=[
            mcp_types.Tool(name="whoami", description="Report the process.", input_schema={"type": "object"}),
            mcp_types.Tool(name="crash", description="Exit the process.", input_schema={"type": "object"}),
        ]
    )


async def call_tool(ctx: Any, params: mcp_types.CallToolRequestParams) -> mcp_types.CallToolResult:
    if params.name == "crash":
        Path(os.environ["GATE_FILE"]).unlink(missing_ok=True)
        os._exit(3)
    payload = {
        "pid": os.getpid(),
        "has_secret": os.environ.get("UPSTREAM_SECRET") == os.environ.get("EXPECTED_SECRET"),
        "key": (params.meta or {}).get("writ/idempotencyKey"),
    }
    return mcp_types.CallToolResult(
        content=[mcp_types.TextContent(type="text", text=json.dumps(payload))], structured_content=payload
    )


async def main() -> None:
    server = Server("stdio-upstream", on_list_tools=list_tools, on_call_tool=call_tool)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


if __name__ == "__main__":
    if not Path(os.environ.get("GATE_FILE", "/nonexistent")).exists():
        sys.exit(1)
    anyio.run(main)
