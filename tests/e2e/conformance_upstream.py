"""An upstream MCP server (stdio) with the conformance suite's fixture tools that only return content.

Behind Writ it lets the suite's content and schema scenarios (tools-call-simple-text, -image, -audio,
-embedded-resource, -mixed-content, -error, json-schema-2020-12, the sync `greet` checks of the tasks
scenarios) see whether Writ relays a tool's result and input schema unchanged, and the SEP-2243
custom-header scenario whether it checks the `Mcp-Param-*` header of a relayed tool's `x-mcp-header`
parameter. Its resources, resource template, prompts and completions are the reference server's, for
the resources-*, prompts-*, completion-complete, SEP-2164 and caching scenarios. The fixtures that need
a call to talk back to the client (progress, logging, sampling, elicitation) or to become a task are
not here: Writ does not relay those.
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
from mcp_types import INVALID_PARAMS


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
]

TEXT = types.TextContent(type="text", text="This is a simple text response for testing.")
IMAGE = types.ImageContent(type="image", data=PNG, mime_type="image/png")
RESOURCE = types.EmbeddedResource(
    type="resource",
    resource=types.TextResourceContents(
        uri="test://embedded-resource", mime_type="text/plain", text="This is an embedded resource content."
    ),
)


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    arguments = params.arguments or {}
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
    return types.ListPromptsResult(prompts=PROMPTS)


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
)


async def main() -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
