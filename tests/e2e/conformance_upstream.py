"""An upstream MCP server (stdio) with the conformance suite's fixture tools that only return content.

Behind Writ it lets the suite's content and schema scenarios (tools-call-simple-text, -image, -audio,
-embedded-resource, -mixed-content, -error, json-schema-2020-12, the sync `greet` checks of the tasks
scenarios) see whether Writ relays a tool's result and input schema unchanged, and the SEP-2243
custom-header scenario whether it checks the `Mcp-Param-*` header of a relayed tool's `x-mcp-header`
parameter. Its resources, resource template, prompts and completions are the reference server's, for
the resources-*, prompts-*, completion-complete, SEP-2164 and caching scenarios. The fixtures that need
a call to become a task are not here (Writ's tasks are its own approvals); those that talk back to
the client during a call (progress, logging, sampling, elicitation) are, since Writ relays them.
"""

from __future__ import annotations

import base64
import io
import json
import re
import struct
import wave
import zlib
from typing import Any

import anyio
import mcp_types as types
from mcp.server import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from mcp_types import INVALID_PARAMS, LOG_LEVEL_META_KEY, MISSING_REQUIRED_CLIENT_CAPABILITY
from mcp_types.version import MODERN_PROTOCOL_VERSIONS


def _png() -> str:
    """One black pixel."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0)  # 1x1, 8-bit greyscale
    image = chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\x00\x00")) + chunk(b"IEND", b"")
    return base64.b64encode(b"\x89PNG\r\n\x1a\n" + image).decode()


def _silence() -> str:
    """10 ms of silence, 8 kHz mono."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(8000)
        out.writeframes(b"\x00\x00" * 80)
    return base64.b64encode(buffer.getvalue()).decode()


PNG = _png()
WAV = _silence()
NO_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {}}
# As the suite's json-schema-2020-12 scenario gives it: every keyword must reach the client unchanged.
SCHEMA_2020_12: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {
        "address": {
            "$anchor": "addressDef",
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
        }
    },
    "properties": {
        "name": {"type": "string"},
        "address": {"$ref": "#/$defs/address"},
        "contactMethod": {"type": "string", "enum": ["phone", "email"]},
        "phone": {"type": "string"},
        "email": {"type": "string"},
    },
    "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
    "if": {"properties": {"contactMethod": {"const": "phone"}}, "required": ["contactMethod"]},
    "then": {"required": ["phone"]},
    "else": {"required": ["email"]},
    "additionalProperties": False,
}
# A parameter mirrored in an `Mcp-Param-Region` header (SEP-2243), which the server must check.
HEADER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"region": {"type": "string", "x-mcp-header": "Region"}},
    "required": ["region"],
}
GREET_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"type": "string"}},
    "required": ["name"],
}


PROMPT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"prompt": {"type": "string"}},
    "required": ["prompt"],
}
MESSAGE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"message": {"type": "string"}},
    "required": ["message"],
}
USER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "username": {"type": "string", "description": "User's response"},
        "email": {"type": "string", "description": "User's email address"},
    },
    "required": ["username", "email"],
}
DEFAULTS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "default": "John Doe"},
        "age": {"type": "integer", "default": 30},
        "score": {"type": "number", "default": 95.5},
        "status": {"type": "string", "enum": ["active", "inactive", "pending"], "default": "active"},
        "verified": {"type": "boolean", "default": True},
    },
}
ENUMS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "untitledSingle": {"type": "string", "enum": ["option1", "option2", "option3"]},
        "titledSingle": {
            "type": "string",
            "oneOf": [
                {"const": "value1", "title": "First Option"},
                {"const": "value2", "title": "Second Option"},
                {"const": "value3", "title": "Third Option"},
            ],
        },
        "legacyEnum": {
            "type": "string",
            "enum": ["opt1", "opt2", "opt3"],
            "enumNames": ["Option One", "Option Two", "Option Three"],
        },
        "untitledMulti": {
            "type": "array",
            "items": {"type": "string", "enum": ["option1", "option2", "option3"]},
        },
        "titledMulti": {
            "type": "array",
            "items": {
                "anyOf": [
                    {"const": "value1", "title": "First Choice"},
                    {"const": "value2", "title": "Second Choice"},
                    {"const": "value3", "title": "Third Choice"},
                ]
            },
        },
    },
}


def _tool(name: str, description: str, schema: dict[str, Any] = NO_ARGUMENTS) -> types.Tool:
    annotations = types.ToolAnnotations(read_only_hint=True)
    return types.Tool(name=name, description=description, input_schema=schema, annotations=annotations)


TOOLS = [
    _tool("test_simple_text", "Returns one text item."),
    _tool("test_image_content", "Returns one PNG image."),
    _tool("test_audio_content", "Returns one WAV clip."),
    _tool("test_embedded_resource", "Returns one embedded text resource."),
    _tool("test_multiple_content_types", "Returns text, an image and an embedded resource."),
    _tool("test_error_handling", "Always fails, as a tool error (isError)."),
    _tool(
        "json_schema_2020_12_tool", "Has an input schema with JSON Schema 2020-12 keywords.", SCHEMA_2020_12
    ),
    _tool("greet", "Says hello to `name`.", GREET_SCHEMA),
    _tool("echo_region", "Says which region it was given.", HEADER_SCHEMA),
    # These talk back to the client during the call; Writ relays what they say.
    _tool("test_tool_with_progress", "Reports progress 0, 50 and 100 of 100."),
    _tool("test_tool_with_logging", "Logs three messages at info, 50 ms apart."),
    _tool("test_sampling", "Asks the client's model.", PROMPT_SCHEMA),
    _tool("test_elicitation", "Asks the user.", MESSAGE_SCHEMA),
    _tool("test_elicitation_sep1034_defaults", "Asks the user, with defaults (SEP-1034)."),
    _tool("test_elicitation_sep1330_enums", "Asks the user to choose (SEP-1330)."),
    _tool("test_logging_tool", "Logs three messages at info, to a request that asked for them."),
    _tool("test_streaming_elicitation", "Asks the user for a name and an email."),
    _tool("test_missing_capability", "Asks the client's model; refuses with -32021 if it cannot."),
    # These change the listings and announce it (SEP-2575's list-changed checks).
    _tool("test_trigger_tool_change", "Adds or removes the tool test_added_tool."),
    _tool("test_trigger_prompt_change", "Adds or removes the prompt test_added_prompt."),
]
ADDED_TOOL = _tool("test_added_tool", "Here between two calls of test_trigger_tool_change.")
ADDED_PROMPT = types.Prompt(name="test_added_prompt", description="Here between two prompt changes.")
CHANGED: dict[str, bool] = {"tools": False, "prompts": False}

TEXT = types.TextContent(type="text", text="This is a simple text response for testing.")
IMAGE = types.ImageContent(type="image", data=PNG, mime_type="image/png")
RESOURCE = types.EmbeddedResource(
    type="resource",
    resource=types.TextResourceContents(
        uri="test://embedded-resource", mime_type="text/plain", text="This is an embedded resource content."
    ),
)


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=[*TOOLS, ADDED_TOOL] if CHANGED["tools"] else TOOLS)


async def _ask(ctx: Any, params: types.CallToolRequestParams, request: Any, shape: Any) -> Any:
    """The client's answer: asked mid-call (2025-11-25), or in an input-required round (2026-07-28:
    an `InputRequiredResult` to return, then the answer the retry carries)."""
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        answer = (params.input_responses or {}).get("ask")
        if answer is None:
            return types.InputRequiredResult(input_requests={"ask": request}, request_state="asked")
        return answer
    metadata = ServerMessageMetadata(related_request_id=ctx.request_id)
    return await ctx.session.send_request(request, shape, metadata=metadata)


async def _log(ctx: Any, text: str) -> None:
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS and (ctx.meta or {}).get(LOG_LEVEL_META_KEY) is None:
        return  # 2026-07-28: only a request that opted in hears log messages
    params = types.LoggingMessageNotificationParams(level="info", data=text, logger="conformance-fixtures")
    notification = types.LoggingMessageNotification(params=params)
    await ctx.session.send_notification(notification, related_request_id=ctx.request_id)


async def _elicit(ctx: Any, params: types.CallToolRequestParams, message: str, schema: dict[str, Any]) -> Any:
    request = types.ElicitRequest(
        params=types.ElicitRequestFormParams(message=message, requested_schema=schema)
    )
    return await _ask(ctx, params, request, types.ElicitResult)


async def _talking(ctx: Any, params: types.CallToolRequestParams) -> Any:
    """The fixture tools that talk back to the client during the call."""
    arguments = params.arguments or {}
    said: str
    match params.name:
        case "test_tool_with_progress":
            for done in (0, 50, 100):
                await ctx.session.report_progress(done, 100, f"{done}%")
                await anyio.sleep(0.05)
            said = "Progress reported."
        case "test_tool_with_logging" | "test_logging_tool":
            for text in ("Tool execution started", "Tool processing data", "Tool execution completed"):
                await _log(ctx, text)
                await anyio.sleep(0.05)
            said = "Logged."
        case "test_sampling":
            message = types.SamplingMessage(
                role="user", content=types.TextContent(type="text", text=str(arguments["prompt"]))
            )
            request = types.CreateMessageRequest(
                params=types.CreateMessageRequestParams(messages=[message], max_tokens=100)
            )
            answer = await _ask(ctx, params, request, types.CreateMessageResult)
            if isinstance(answer, types.InputRequiredResult):
                return answer
            text = answer.content.text if isinstance(answer.content, types.TextContent) else ""
            said = f"LLM response: {text}"
        case "test_elicitation" | "test_streaming_elicitation":
            message = str(arguments.get("message", "Please provide your information"))
            answer = await _elicit(ctx, params, message, USER_SCHEMA)
            if isinstance(answer, types.InputRequiredResult):
                return answer
            said = f"User response: action={answer.action}, content={json.dumps(answer.content)}"
        case _:
            schema = DEFAULTS_SCHEMA if params.name.endswith("defaults") else ENUMS_SCHEMA
            answer = await _elicit(ctx, params, "Please review and update the form fields", schema)
            if isinstance(answer, types.InputRequiredResult):
                return answer
            said = f"Elicitation completed: action={answer.action}, content={json.dumps(answer.content)}"
    return types.CallToolResult(content=[types.TextContent(type="text", text=said)])


TALKING = {
    "test_tool_with_progress",
    "test_tool_with_logging",
    "test_sampling",
    "test_elicitation",
    "test_elicitation_sep1034_defaults",
    "test_elicitation_sep1330_enums",
    "test_logging_tool",
    "test_streaming_elicitation",
}


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> Any:
    arguments = params.arguments or {}
    if params.name in ("test_trigger_tool_change", "test_trigger_prompt_change"):
        listing = "tools" if params.name == "test_trigger_tool_change" else "prompts"
        CHANGED[listing] = not CHANGED[listing]
        changed = (
            types.ToolListChangedNotification()
            if listing == "tools"
            else types.PromptListChangedNotification()
        )
        await ctx.session.send_notification(changed)
        return types.CallToolResult(content=[types.TextContent(type="text", text=f"{listing} changed")])
    if params.name == "test_missing_capability":
        # SEP-2575: a tool that needs a client capability refuses with -32021, a JSON-RPC error naming it.
        # Writ refuses this upstream's sampling request when its own client did not declare sampling.
        message = types.SamplingMessage(role="user", content=types.TextContent(type="text", text="Hello?"))
        request = types.CreateMessageRequest(
            params=types.CreateMessageRequestParams(messages=[message], max_tokens=10)
        )
        try:
            await _ask(ctx, params, request, types.CreateMessageResult)
        except MCPError as exc:
            needs = "This tool requires the client 'sampling' capability"
            required = {"requiredCapabilities": {"sampling": {}}}
            raise MCPError(MISSING_REQUIRED_CLIENT_CAPABILITY, needs, required) from exc
        return types.CallToolResult(content=[types.TextContent(type="text", text="Sampled.")])
    if params.name in TALKING:
        try:
            return await _talking(ctx, params)
        except MCPError as exc:
            failed = types.TextContent(type="text", text=f"The client was not asked: {exc.message}")
            return types.CallToolResult(content=[failed], is_error=True)
    content: list[Any]
    match params.name:
        case "test_simple_text":
            content = [TEXT]
        case "test_image_content":
            content = [IMAGE]
        case "test_audio_content":
            content = [types.AudioContent(type="audio", data=WAV, mime_type="audio/wav")]
        case "test_embedded_resource":
            content = [RESOURCE]
        case "test_multiple_content_types":
            content = [TEXT, IMAGE, RESOURCE]
        case "test_error_handling":
            failed = types.TextContent(
                type="text", text="This tool intentionally returns an error for testing"
            )
            return types.CallToolResult(content=[failed], is_error=True)
        case "greet":
            content = [types.TextContent(type="text", text=f"Hello, {arguments['name']}!")]
        case "echo_region":
            content = [types.TextContent(type="text", text=f"region {arguments['region']}")]
        case _:
            content = [types.TextContent(type="text", text=f"called {params.name}")]
    return types.CallToolResult(content=content)


# The reference server's resources, template, prompts and completions, relayed by Writ (resources and
# prompts of this backend are on in tests/e2e/test_conformance.py, and policy lets the suite read them).

STATIC_TEXT = types.TextResourceContents(
    uri="test://static-text", mime_type="text/plain", text="This is the content of the static text resource."
)
STATIC_BINARY = types.BlobResourceContents(uri="test://static-binary", mime_type="image/png", blob=PNG)
TEMPLATE = re.compile(r"test://template/([^/]+)/data")


async def list_resources(ctx: Any, params: Any) -> types.ListResourcesResult:
    return types.ListResourcesResult(
        resources=[
            types.Resource(
                uri=STATIC_TEXT.uri,
                name="static-text",
                description="A static text resource.",
                mime_type="text/plain",
            ),
            types.Resource(
                uri=STATIC_BINARY.uri,
                name="static-binary",
                description="A static PNG.",
                mime_type="image/png",
            ),
        ]
    )


async def list_templates(ctx: Any, params: Any) -> types.ListResourceTemplatesResult:
    template = types.ResourceTemplate(
        uri_template="test://template/{id}/data",
        name="template",
        description="Data for an id.",
        mime_type="application/json",
    )
    return types.ListResourceTemplatesResult(resource_templates=[template])


async def read_resource(ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
    if params.uri == STATIC_TEXT.uri:
        return types.ReadResourceResult(contents=[STATIC_TEXT])
    if params.uri == STATIC_BINARY.uri:
        return types.ReadResourceResult(contents=[STATIC_BINARY])
    if match := TEMPLATE.fullmatch(params.uri):
        data = {"id": match[1], "templateTest": True, "data": f"Data for ID: {match[1]}"}
        text = json.dumps(data, separators=(",", ":"))
        contents = types.TextResourceContents(uri=params.uri, mime_type="application/json", text=text)
        return types.ReadResourceResult(contents=[contents])
    raise MCPError(INVALID_PARAMS, "Resource not found", {"uri": params.uri})


def _argument(name: str) -> types.PromptArgument:
    return types.PromptArgument(name=name, description=f"The {name}", required=True)


PROMPTS = [
    types.Prompt(name="test_simple_prompt", description="A prompt without arguments."),
    types.Prompt(
        name="test_prompt_with_arguments",
        description="A prompt with two arguments.",
        arguments=[_argument("arg1"), _argument("arg2")],
    ),
    types.Prompt(
        name="test_prompt_with_embedded_resource",
        description="A prompt embedding a resource.",
        arguments=[_argument("resourceUri")],
    ),
    types.Prompt(name="test_prompt_with_image", description="A prompt with an image."),
]


def _said(text: str) -> types.PromptMessage:
    return types.PromptMessage(role="user", content=types.TextContent(type="text", text=text))


async def list_prompts(ctx: Any, params: Any) -> types.ListPromptsResult:
    return types.ListPromptsResult(prompts=[*PROMPTS, ADDED_PROMPT] if CHANGED["prompts"] else PROMPTS)


async def subscribe(ctx: Any, params: types.SubscribeRequestParams) -> types.EmptyResult:
    return types.EmptyResult()  # its resources never change, so there is never an update to send


async def unsubscribe(ctx: Any, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
    return types.EmptyResult()


async def get_prompt(ctx: Any, params: types.GetPromptRequestParams) -> types.GetPromptResult:
    arguments = params.arguments or {}
    match params.name:
        case "test_simple_prompt":
            messages = [_said("This is a simple prompt for testing.")]
        case "test_prompt_with_arguments":
            messages = [
                _said(f"Prompt with arguments: arg1='{arguments['arg1']}', arg2='{arguments['arg2']}'")
            ]
        case "test_prompt_with_embedded_resource":
            embedded = types.TextResourceContents(
                uri=arguments["resourceUri"],
                mime_type="text/plain",
                text="Embedded resource content for testing.",
            )
            resource = types.EmbeddedResource(type="resource", resource=embedded)
            messages = [
                types.PromptMessage(role="user", content=resource),
                _said("Please process the embedded resource above."),
            ]
        case "test_prompt_with_image":
            messages = [
                types.PromptMessage(role="user", content=IMAGE),
                _said("Please analyze the image above."),
            ]
        case _:
            raise MCPError(INVALID_PARAMS, f"Unknown prompt: {params.name}")
    return types.GetPromptResult(messages=messages)


async def complete(ctx: Any, params: types.CompleteRequestParams) -> types.CompleteResult:
    values = [v for v in ("paris", "park", "party", "test") if v.startswith(params.argument.value)]
    return types.CompleteResult(completion=types.Completion(values=values, total=len(values), has_more=False))


server = Server(
    "conformance-fixtures",
    on_list_tools=list_tools,
    on_call_tool=call_tool,
    on_list_resources=list_resources,
    on_list_resource_templates=list_templates,
    on_read_resource=read_resource,
    on_list_prompts=list_prompts,
    on_get_prompt=get_prompt,
    on_completion=complete,
    on_subscribe_resource=subscribe,
    on_unsubscribe_resource=unsubscribe,
)


async def main() -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
