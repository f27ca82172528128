"""An upstream MCP server (stdio, spoken to in 2026-07-28) with the suite's input-required fixture tools.

Each tool, and the prompt `test_input_required_result_prompt`, answers as the reference server's
does (`examples/servers/everything-server` of the MCP Python SDK): an `InputRequiredResult` under the
reference's own keys, then a result once the retry carries the answers. Behind Writ, the SDK's client
runs these rounds inside the upstream call, and Writ turns each request of them into a round of its
own for its 2026-07-28 client, under the same key (gateway/mcp/parked.py), so the suite's SEP-2322
scenarios see whether a round reaches the client and its answer the upstream.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import mcp_types as types
from mcp.server import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS

NO_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {}}
NAME_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
OK_SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
COLOR_SCHEMA = {"type": "object", "properties": {"color": {"type": "string"}}, "required": ["color"]}


def _tool(name: str, description: str) -> types.Tool:
    annotations = types.ToolAnnotations(read_only_hint=True)
    return types.Tool(name=name, description=description, input_schema=NO_ARGUMENTS, annotations=annotations)


TOOLS = [
    _tool("test_input_required_result_elicitation", "Asks for a name in a round."),
    _tool("test_input_required_result_sampling", "Asks the client's model in a round."),
    _tool("test_input_required_result_list_roots", "Asks for the client's roots in a round."),
    _tool("test_input_required_result_request_state", "A round whose requestState comes back."),
    _tool("test_input_required_result_multiple_inputs", "Asks three things in one round."),
    _tool("test_input_required_result_multi_round", "Asks in three rounds."),
    _tool("test_input_required_result_tampered_state", "A round whose state the client may tamper with."),
    _tool("test_input_required_result_capabilities", "Asks only what the client declared."),
]


PROMPT = types.Prompt(name="test_input_required_result_prompt", description="Asks for context in a round.")
CONTEXT_SCHEMA = {"type": "object", "properties": {"context": {"type": "string"}}, "required": ["context"]}


def _elicit(message: str = "What is your name?", schema: dict[str, Any] = NAME_SCHEMA) -> types.ElicitRequest:
    return types.ElicitRequest(params=types.ElicitRequestFormParams(message=message, requested_schema=schema))


def _sample(text: str, max_tokens: int) -> types.CreateMessageRequest:
    message = types.SamplingMessage(role="user", content=types.TextContent(type="text", text=text))
    return types.CreateMessageRequest(
        params=types.CreateMessageRequestParams(messages=[message], max_tokens=max_tokens)
    )


def _content(answer: Any, field: str) -> Any:
    return answer.content.get(field) if isinstance(answer, types.ElicitResult) and answer.content else None


def _round(requests: dict[str, Any], state: str | None = None) -> types.InputRequiredResult:
    return types.InputRequiredResult(input_requests=requests, request_state=state)


def _said(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> Any:  # noqa: C901  (one case a tool)
    responses = params.input_responses or {}
    state = params.request_state
    match params.name.removeprefix("test_input_required_result_"):
        case "elicitation":
            if "user_name" in responses:
                return _said(f"Hello, {_content(responses['user_name'], 'name') or 'stranger'}!")
            return _round({"user_name": _elicit()})
        case "sampling":
            if "capital_question" in responses:
                answer = responses["capital_question"]
                content = answer.content if isinstance(answer, types.CreateMessageResult) else None
                return _said(f"Model said: {content.text if isinstance(content, types.TextContent) else '?'}")
            return _round({"capital_question": _sample("What is the capital of France?", 100)})
        case "list_roots":
            if "client_roots" in responses:
                answer = responses["client_roots"]
                count = len(answer.roots) if isinstance(answer, types.ListRootsResult) else 0
                return _said(f"Client exposed {count} root(s).")
            return _round({"client_roots": types.ListRootsRequest()})
        case "request_state":
            if "confirm" in responses and state == "request-state-nonce":
                return _said("state-ok: confirmation received")
            return _round({"confirm": _elicit("Please confirm", OK_SCHEMA)}, "request-state-nonce")
        case "multiple_inputs":
            if {"user_name", "greeting", "client_roots"} <= responses.keys():
                return _said("All inputs received.")
            asked = {
                "user_name": _elicit(),
                "greeting": _sample("Generate a greeting", 50),
                "client_roots": types.ListRootsRequest(),
            }
            return _round(asked, "multiple-inputs")
        case "multi_round":
            step = json.loads(state) if state else {"round": 0}
            if step["round"] == 1 and "step1" in responses:
                name = _content(responses["step1"], "name")
                color = _elicit("Step 2: What is your favorite color?", COLOR_SCHEMA)
                return _round({"step2": color}, json.dumps({"round": 2, "name": name}))
            if step["round"] == 2 and "step2" in responses:
                return _said(f"{step.get('name')} likes {_content(responses['step2'], 'color')}.")
            return _round({"step1": _elicit("Step 1: What is your name?")}, json.dumps({"round": 1}))
        case "tampered_state":
            if state is None:
                return _round({"confirm": _elicit("Please confirm", OK_SCHEMA)}, "round-1")
            return _said(f"state-ok: {state}")
        case "capabilities":
            declared = ctx.session.client_capabilities
            requests: dict[str, Any] = {}
            if declared is None or declared.sampling is not None:
                requests["sample"] = _sample("Say hello", 50)
            if declared is None or declared.elicitation is not None:
                requests["ask"] = _elicit()
            return _round(requests, "capability-gated")
    raise MCPError(INVALID_PARAMS, f"Unknown tool: {params.name}")


async def list_prompts(ctx: Any, params: Any) -> types.ListPromptsResult:
    return types.ListPromptsResult(prompts=[PROMPT])


async def get_prompt(ctx: Any, params: types.GetPromptRequestParams) -> Any:
    """The reference's prompt that asks for its context in a round before it answers."""
    if params.name != PROMPT.name:
        raise MCPError(INVALID_PARAMS, f"Unknown prompt: {params.name}")
    responses = params.input_responses or {}
    if "user_context" not in responses:
        return _round({"user_context": _elicit("What context should the prompt use?", CONTEXT_SCHEMA)})
    context = _content(responses["user_context"], "context") or "none"
    text = types.TextContent(type="text", text=f"Prompt with context: {context}")
    return types.GetPromptResult(messages=[types.PromptMessage(role="user", content=text)])


async def main() -> None:
    server: Server[Any] = Server(
        "conformance-rounds",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_prompts=list_prompts,
        on_get_prompt=get_prompt,
    )
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
