"""An upstream MCP server whose tools change while it runs, and whose resources are updated.

python shifting_upstream.py NAME     # over stdio
`shifting_app(NAME)`                 # the same server as a streamable HTTP app, for uvicorn

Its tools are named after NAME, so two of them sit behind one gateway without renames: `NAME_pay(amount)`
and `NAME_reshape(shape)`. `NAME_reshape` with shape 2 makes `NAME_pay` also require a `currency` and
adds `NAME_extra`; with shape 1 it goes back; either way the server announces
`notifications/tools/list_changed` (on 2026-07-28, on the open `subscriptions/listen` streams).
`NAME_touch(uri)` announces `notifications/resources/updated` for `note://NAME`, the one resource it
serves, to the sessions that subscribed to it.
"""

from __future__ import annotations

import sys
from typing import Any

import anyio
import mcp_types as types
from mcp.server import Server
from mcp.server.stdio import stdio_server
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import ResourceUpdated, ToolsListChanged
from starlette.types import ASGIApp


def _tool(name: str, properties: dict[str, Any], required: list[str]) -> types.Tool:
    schema = {"type": "object", "properties": properties, "required": required}
    return types.Tool(name=name, input_schema=schema)


def shifting_server(name: str) -> Server[Any]:
    state: dict[str, Any] = {"shape": 1, "subscribers": []}
    bus = InMemorySubscriptionBus()  # 2026-07-28: announcements go to subscriptions/listen streams

    def tools() -> list[types.Tool]:
        amount = {"amount": {"type": "number"}}
        reshape = _tool(f"{name}_reshape", {"shape": {"type": "integer"}}, ["shape"])
        touch = _tool(f"{name}_touch", {}, [])
        if state["shape"] == 1:
            return [_tool(f"{name}_pay", amount, ["amount"]), reshape, touch]
        pay = _tool(f"{name}_pay", {**amount, "currency": {"type": "string"}}, ["amount", "currency"])
        return [pay, reshape, touch, _tool(f"{name}_extra", {}, [])]

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools())

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        arguments = params.arguments or {}
        if params.name == f"{name}_pay":
            text = f"paid {arguments['amount']} {arguments.get('currency', '')}".strip()
        elif params.name == f"{name}_reshape":
            state["shape"] = int(arguments["shape"])
            await ctx.session.send_tool_list_changed()
            await bus.publish(ToolsListChanged())
            text = f"shape {state['shape']}"
        elif params.name == f"{name}_touch":
            for session in list(state["subscribers"]):
                await session.send_resource_updated(f"note://{name}")
            await bus.publish(ResourceUpdated(uri=f"note://{name}"))
            text = f"touched note://{name} for {len(state['subscribers'])}"
        elif params.name == f"{name}_extra":
            text = "extra"
        else:
            raise MCPError(-32602, f"Unknown tool: {params.name}")
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)])

    async def list_resources(ctx: Any, params: Any) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=[types.Resource(uri=f"note://{name}", name=name)])

    async def read_resource(ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        if params.uri != f"note://{name}":
            raise MCPError(-32002, f"Resource not found: {params.uri}")
        text = types.TextResourceContents(uri=params.uri, text=f"{name} is at shape {state['shape']}")
        return types.ReadResourceResult(contents=[text])

    async def subscribe(ctx: Any, params: types.SubscribeRequestParams) -> types.EmptyResult:
        if params.uri != f"note://{name}":
            raise MCPError(-32002, f"Resource not found: {params.uri}")
        state["subscribers"].append(ctx.session)
        return types.EmptyResult()

    async def unsubscribe(ctx: Any, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        state["subscribers"].clear()
        return types.EmptyResult()

    return Server(
        name,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_read_resource=read_resource,
        on_subscribe_resource=subscribe,
        on_unsubscribe_resource=unsubscribe,
        on_subscriptions_listen=ListenHandler(bus),
    )


def shifting_app(name: str) -> ASGIApp:
    return shifting_server(name).streamable_http_app(
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False)
    )


async def _serve_stdio(name: str) -> None:
    server = shifting_server(name)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(_serve_stdio, sys.argv[1])
