"""An upstream MCP server whose tools talk during a call, in either protocol era.

python chatty_upstream.py NAME     # over stdio
`chatty_app(NAME)`                 # the same server as a streamable HTTP app, for uvicorn

Tools: `count(n)` reports n progress steps and logs at debug, info and warning; `wait()` reports one
step and waits until it is cancelled (in-process, `CANCELLED` counts those); `ask(question)` asks the
user for a name and a PIN (elicitation), or with `polite: true` only a client that declared
elicitation (`POLITE` otherwise, as the conformance suite's fixture does); `think(prompt)` asks the
client's model (sampling). The prompt `sign` asks for the name and PIN as `ask` does before it
answers. On 2025-11-25 it asks mid-call, on 2026-07-28 in input-required rounds. `ASKED` counts, per
NAME and tool, the calls that reached it.
"""

from __future__ import annotations

import sys
from collections import Counter
from typing import Any

import anyio
import mcp_types as types
from mcp.server import Server
from mcp.server.stdio import stdio_server
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from mcp_types import LOG_LEVEL_META_KEY
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from starlette.types import ASGIApp

CANCELLED: Counter[str] = Counter()
ASKED: Counter[str] = Counter()
LEVELS = ["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"]
PIN_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "pin": {"type": "string"}},
    "required": ["name", "pin"],
}

_OBJECT = {"type": "object"}


def _tool(name: str, properties: dict[str, Any]) -> types.Tool:
    return types.Tool(name=name, input_schema={**_OBJECT, "properties": properties})


TOOLS = [
    _tool("count", {"n": {"type": "integer"}}),
    _tool("wait", {}),
    _tool("ask", {"question": {"type": "string"}, "pin": {"type": "string"}, "polite": {"type": "boolean"}}),
    _tool("think", {"prompt": {"type": "string"}}),
    _tool("needy", {}),
]
SIGN = types.Prompt(
    name="sign",
    description="Asks who signs before it answers.",
    arguments=[types.PromptArgument(name="pin", description="Not asked again if given.")],
)
POLITE = "not asked: the client cannot be asked"
NEEDS_SAMPLING = "This tool requires the client 'sampling' capability"


def _text(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


def chatty_server(name: str) -> Server[Any]:
    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=TOOLS)

    async def log(ctx: Any, level: types.LoggingLevel, text: str) -> None:
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            asked = (ctx.meta or {}).get(LOG_LEVEL_META_KEY)
            if asked not in LEVELS or LEVELS.index(level) < LEVELS.index(asked):
                return
        params = types.LoggingMessageNotificationParams(level=level, data=text, logger=name)
        notification = types.LoggingMessageNotification(params=params)
        await ctx.session.send_notification(notification, related_request_id=ctx.request_id)

    async def ask_client(ctx: Any, params: types.InputResponseRequestParams, request: Any, shape: Any) -> Any:
        """The client's answer to `request`: mid-call, or in an input-required round (None: asked)."""
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            answer = (params.input_responses or {}).get("it")
            if answer is None:
                return types.InputRequiredResult(input_requests={"it": request}, request_state="asked")
            return answer
        metadata = ServerMessageMetadata(related_request_id=ctx.request_id)
        return await ctx.session.send_request(request, shape, metadata=metadata)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> Any:
        arguments = params.arguments or {}
        ASKED[f"{name}:{params.name}"] += 1
        if params.name == "count":
            n = int(arguments.get("n", 3))
            for step in range(1, n + 1):
                await ctx.session.report_progress(step, n, f"step {step} of {n}")
            for level in ("debug", "info", "warning"):
                await log(ctx, level, f"{name} counted at {level}")
            return _text(f"counted to {n}")
        if params.name == "wait":
            await ctx.session.report_progress(1, 2, "waiting")
            try:
                await anyio.sleep_forever()
            except anyio.get_cancelled_exc_class():
                CANCELLED[name] += 1
                raise
        if params.name == "ask":
            elicits = types.ClientCapabilities(elicitation=types.ElicitationCapability())
            if arguments.get("polite") and not ctx.session.check_client_capability(elicits):
                return _text(POLITE)
            request = types.ElicitRequest(
                params=types.ElicitRequestFormParams(
                    message=str(arguments.get("question", "Who are you?")), requested_schema=PIN_SCHEMA
                )
            )
            try:
                answer = await ask_client(ctx, params, request, types.ElicitResult)
            except MCPError as exc:
                return types.CallToolResult(
                    content=[types.TextContent(type="text", text=f"not asked: {exc.message}")],
                    is_error=True,
                )
            if isinstance(answer, types.InputRequiredResult):
                return answer
            content = answer.content or {}
            return _text(
                f"{answer.action}: {content.get('name')} with a PIN of {len(str(content.get('pin', '')))}"
            )
        if params.name == "think":
            message = types.SamplingMessage(
                role="user", content=types.TextContent(type="text", text=str(arguments.get("prompt", "")))
            )
            request = types.CreateMessageRequest(
                params=types.CreateMessageRequestParams(messages=[message], max_tokens=50)
            )
            try:
                answer = await ask_client(ctx, params, request, types.CreateMessageResult)
            except MCPError as exc:
                return types.CallToolResult(
                    content=[types.TextContent(type="text", text=f"not asked: {exc.message}")],
                    is_error=True,
                )
            if isinstance(answer, types.InputRequiredResult):
                return answer
            said = answer.content.text if isinstance(answer.content, types.TextContent) else "?"
            return _text(f"{answer.model} says: {said}")
        if params.name == "needy":
            # SEP-2575: a tool that cannot go on without a client capability refuses with -32021.
            raise MCPError(-32021, NEEDS_SAMPLING, {"requiredCapabilities": {"sampling": {}}})
        raise MCPError(-32602, f"Unknown tool: {params.name}")

    async def list_prompts(ctx: Any, params: Any) -> types.ListPromptsResult:
        return types.ListPromptsResult(prompts=[SIGN])

    async def get_prompt(ctx: Any, params: types.GetPromptRequestParams) -> Any:
        if params.name != SIGN.name:
            raise MCPError(-32602, f"Unknown prompt: {params.name}")
        ASKED[f"{name}:prompt:{params.name}"] += 1
        params_ = types.ElicitRequestFormParams(message="Who signs?", requested_schema=PIN_SCHEMA)
        answer = await ask_client(ctx, params, types.ElicitRequest(params=params_), types.ElicitResult)
        if isinstance(answer, types.InputRequiredResult):
            return answer
        content = answer.content or {}
        text = types.TextContent(type="text", text=f"Signed by {content.get('name')}")
        return types.GetPromptResult(messages=[types.PromptMessage(role="user", content=text)])

    return Server(
        name,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_prompts=list_prompts,
        on_get_prompt=get_prompt,
    )


def chatty_app(name: str) -> ASGIApp:
    return chatty_server(name).streamable_http_app(
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False)
    )


async def _serve_stdio(name: str) -> None:
    server = chatty_server(name)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(_serve_stdio, sys.argv[1])
