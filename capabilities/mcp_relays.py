"""An upstream MCP server's resources and prompts as Writ relays them, named as its config says.

A relayed resource read and prompt get is a call like any other: it has a capability (effect `read`),
so the pipeline decides, records and dispatches it as it does a tool call. Each backend that relays
resources has one resource capability, whose argument is the URI; each relayed prompt has its own,
whose arguments are the prompt's. Neither is ever listed or called as a tool (`Capability.kind`).

The listings themselves (resources, templates) and completions are asked of the upstream when a client
asks; only what it may read is shown (`gateway.mcp.relays`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import anyio
import mcp_types
from mcp import MCPError
from pydantic import BaseModel, ValidationError

from capabilities.config import McpBackend, McpPrompts
from capabilities.contract import BackendUnavailable, Capability, ConfigError
from capabilities.names import logged, name_problem, shown_text

logger = logging.getLogger(__name__)

READ_RESOURCE = "resources/read"
"""The tool name a resource read is recorded under (what `writ calls list` shows)."""

MAX_PAGES = 100
"""Pages of one upstream listing read at most: an upstream that hands out cursors forever ends here."""

RESOURCE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"uri": {"type": "string", "minLength": 1}},
    "required": ["uri"],
    "additionalProperties": False,
}

_Page = TypeVar("_Page", bound=BaseModel)


def resource_id(backend: str) -> str:
    """The id of a backend's resource capability (a `/` no MCP tool name has, so no tool's id)."""
    return f"{backend}/resources"


def prompt_id(backend: str, upstream: str) -> str:
    return f"{backend}/prompts/{upstream}"


def resource_capability(backend: str, config: McpBackend) -> Capability:
    """The capability every resource read of this backend goes through."""
    assert config.resources is not None
    return Capability(
        id=resource_id(backend),
        version="1",
        tool_name=READ_RESOURCE,
        backend=backend,
        input_schema=RESOURCE_SCHEMA,
        effect="read",
        description=f"Read a resource of {backend}",
        dedupe_window_s=0,
        timeout_s=config.timeout_s,
        summary=f"read {{uri}} from {backend}",
        definition={"relay": "resources", **_backend_definition(config)},
        kind="resource",
    )


def prompt_capabilities(
    backend: str, config: McpBackend, prompts: Sequence[mcp_types.Prompt]
) -> list[Capability]:
    """One capability per relayed upstream prompt, in the upstream's order.

    Raises:
        ConfigError: `prompts.names`, `rename` or `redact` name a prompt the upstream does not list,
            or `redact` an argument the prompt does not take.
    """
    settings = config.prompts
    assert settings is not None
    names = {prompt.name for prompt in prompts}
    named = {
        "names": [] if settings.names == "*" else settings.names,
        "rename": list(settings.rename),
        "redact": list(settings.redact),
    }
    problems = [
        f"prompts.{section} names {', '.join(missing)}"
        for section, listed in named.items()
        if (missing := sorted(set(listed) - names))
    ]
    if problems:
        raise ConfigError(
            f"backend {backend!r}: the upstream does not list these prompts: {'; '.join(problems)} "
            f"(it lists {', '.join(sorted(names)) or 'none'})"
        )
    wanted = names if settings.names == "*" else set(settings.names)
    return [
        _prompt(backend, config, settings, p)
        for p in prompts
        if p.name in wanted and _takes(backend, settings, p)
    ]


def _takes(backend: str, settings: McpPrompts, prompt: mcp_types.Prompt) -> bool:
    # As for tools (`capabilities.names`): a name Writ cannot record or a person cannot read is left out.
    problem = name_problem(settings.shown(prompt.name), prompt_id(backend, prompt.name))
    if problem is not None:
        logger.error("mcp backend %r: prompt %s left out: its name %s", backend, logged(prompt.name), problem)
    return problem is None


def _prompt(backend: str, config: McpBackend, settings: McpPrompts, prompt: mcp_types.Prompt) -> Capability:
    arguments = prompt.arguments or []
    redact = settings.redact.get(prompt.name, ())
    unknown = sorted(set(redact) - {a.name for a in arguments})
    if unknown:
        raise ConfigError(
            f"backend {backend!r}: prompts.redact.{prompt.name} names {', '.join(unknown)}, "
            "not an argument of the upstream prompt"
        )
    properties: dict[str, Any] = {}
    for argument in arguments:
        spec: dict[str, Any] = {"type": "string"}
        if argument.description:
            spec["description"] = shown_text(argument.description)
        if argument.title:
            spec["title"] = shown_text(argument.title)
        properties[argument.name] = spec
    schema = {
        "type": "object",
        "properties": properties,
        "required": [a.name for a in arguments if a.required],
        "additionalProperties": False,
    }
    return Capability(
        id=prompt_id(backend, prompt.name),
        version="1",
        tool_name=settings.shown(prompt.name),
        backend=backend,
        input_schema=schema,
        effect="read",
        description=shown_text(prompt.description or ""),
        title=shown_text(prompt.title) if prompt.title else None,
        dedupe_window_s=0,
        timeout_s=config.timeout_s,
        redact=tuple(redact),
        definition={"relay": "prompts", **_backend_definition(config)},
        kind="prompt",
    )


def prompt_of(capability: Capability) -> mcp_types.Prompt:
    """The prompt as Writ lists it: its shown name, and its arguments from the capability's schema."""
    properties = capability.input_schema.get("properties") or {}
    required = set(capability.input_schema.get("required") or ())
    return mcp_types.Prompt(
        name=capability.tool_name,
        title=capability.title,
        description=capability.description or None,
        arguments=[
            mcp_types.PromptArgument(
                name=name,
                title=spec.get("title"),
                description=spec.get("description"),
                required=name in required,
            )
            for name, spec in properties.items()
        ],
    )


def _backend_definition(config: McpBackend) -> dict[str, Any]:
    # As for tools: header and environment names without their values (literal ones may be secrets).
    backend = config.model_dump(
        mode="json", exclude={"overrides", "headers", "env", "rename", "tools", "defaults"}
    )
    backend["headers"] = sorted(config.headers)
    backend["env"] = sorted(config.env)
    return {"backend": backend}


# --- URIs ------------------------------------------------------------------------------------------


def shown_uri(prefix: str, upstream_uri: str) -> str:
    return prefix + upstream_uri


def upstream_uri(prefix: str, uri: str) -> str | None:
    """The upstream's URI for one Writ shows, None when it is not one of this backend's."""
    if not uri.startswith(prefix) or len(uri) == len(prefix):
        return None
    return uri[len(prefix) :]


def prefixed_contents(prefix: str, result: mcp_types.ReadResourceResult) -> mcp_types.ReadResourceResult:
    """A read's contents with their URIs as Writ shows them."""
    if not prefix:
        return result
    contents = [c.model_copy(update={"uri": shown_uri(prefix, c.uri)}) for c in result.contents]
    return result.model_copy(update={"contents": contents})


def prefixed_messages(prefix: str, result: mcp_types.GetPromptResult) -> mcp_types.GetPromptResult:
    """A prompt's messages with the URIs of the resources they embed or link as Writ shows them, so
    a client that reads one reads it through Writ, from this backend."""
    if not prefix:
        return result
    messages = []
    for message in result.messages:
        content = message.content
        if isinstance(content, mcp_types.EmbeddedResource):
            inner = content.resource.model_copy(update={"uri": shown_uri(prefix, content.resource.uri)})
            content = content.model_copy(update={"resource": inner})
        elif isinstance(content, mcp_types.ResourceLink):
            content = content.model_copy(update={"uri": shown_uri(prefix, content.uri)})
        messages.append(message.model_copy(update={"content": content}))
    return result.model_copy(update={"messages": messages})


# --- listings -------------------------------------------------------------------------------------


async def all_pages(
    name: str,
    what: str,
    timeout_s: float,
    fetch: Callable[[str | None], Awaitable[_Page]],
    items: Callable[[_Page], Sequence[Any]],
    cursor_of: Callable[[_Page], str | None],
    describe: Callable[[BaseException], str],
) -> list[Any]:
    """Every item of an upstream listing, page after page, within `timeout_s` and `MAX_PAGES`.

    Raises:
        BackendUnavailable: the listing failed, or did not end in time.
    """
    found: list[Any] = []
    cursor: str | None = None
    try:
        with anyio.fail_after(timeout_s):
            for _ in range(MAX_PAGES):
                page = await fetch(cursor)
                found.extend(items(page))
                cursor = cursor_of(page)
                if not cursor:
                    return found
    except (MCPError, TimeoutError, ValidationError, RuntimeError) as exc:
        raise BackendUnavailable(f"mcp backend {name!r}: {what} failed: {describe(exc)}") from exc
    raise BackendUnavailable(f"mcp backend {name!r}: {what} gave more than {MAX_PAGES} pages")
