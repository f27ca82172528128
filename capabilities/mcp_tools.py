"""Turning an upstream MCP server's tool listing into Writ capabilities, as the backend config says."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, TypeVar

import mcp_types

from capabilities.config import McpBackend, McpReconcile, McpToolSettings, ToolErrors, check_horizon
from capabilities.contract import Capability, ConfigError, EffectClass
from capabilities.names import logged, name_problem, shown_schema, shown_text

logger = logging.getLogger(__name__)

_T = TypeVar("_T")


def capabilities_from_tools(
    backend: str, config: McpBackend, tools: Sequence[mcp_types.Tool]
) -> list[Capability]:
    """One capability per exposed upstream tool, in the upstream's order.

    The id is `<backend>.<upstream name>`; the tool name is the renamed one. The effect comes from
    an override, else `read` when the upstream marks the tool read-only, else the defaults, else
    `write`. A tool whose name Writ cannot take (`capabilities.names`) is left out, logged as an error.

    Raises:
        ConfigError: `tools:`, `rename:` or `overrides:` names a tool the upstream does not list.
    """
    names = [tool.name for tool in tools]
    _check_known(backend, config, set(names))
    wanted = set(names) if config.tools == "*" else set(config.tools)
    return [
        _capability(backend, config, tool)
        for tool in tools
        if tool.name in wanted and _takes(backend, config, tool)
    ]


def _takes(backend: str, config: McpBackend, tool: mcp_types.Tool) -> bool:
    problem = name_problem(config.rename.get(tool.name, tool.name), f"{backend}.{tool.name}")
    if problem is not None:
        logger.error("mcp backend %r: tool %s left out: its name %s", backend, logged(tool.name), problem)
    return problem is None


def _check_known(backend: str, config: McpBackend, upstream: set[str]) -> None:
    problems = []
    for section, named in (
        ("tools", [] if config.tools == "*" else config.tools),
        ("rename", list(config.rename)),
        ("overrides", list(config.overrides)),
        ("reconcile", reconcile_tools(config)),
    ):
        missing = sorted(set(named) - upstream)
        if missing:
            problems.append(f"{section} names {', '.join(missing)}")
    if problems:
        raise ConfigError(
            f"backend {backend!r}: the upstream does not list these tools: {'; '.join(problems)} "
            f"(it lists {', '.join(sorted(upstream)) or 'none'})"
        )


def reconcile_tools(config: McpBackend) -> list[str]:
    """The upstream tools `reconcile:` settings name (they need not be exposed themselves)."""
    settings = [config.defaults, *config.overrides.values()]
    return [s.reconcile.tool for s in settings if s.reconcile is not None]


def reconcile_setting(config: McpBackend, tool: str) -> McpReconcile | None:
    """The lookup for upstream `tool`: its override's, else the backend default's."""
    override = config.overrides.get(tool)
    if override is not None and override.reconcile is not None:
        return override.reconcile
    return config.defaults.reconcile


def tool_errors_setting(config: McpBackend, tool: str) -> ToolErrors:
    """When upstream `tool` reports errors: its override's `tool_errors`, else the backend default's,
    else `may_follow_effect`."""
    override = config.overrides.get(tool, McpToolSettings())
    return _first(override.tool_errors, config.defaults.tool_errors, "may_follow_effect")


def _capability(backend: str, config: McpBackend, tool: mcp_types.Tool) -> Capability:
    override = config.overrides.get(tool.name, McpToolSettings())
    _check_redact(backend, tool, override)
    defaults = config.defaults
    annotations = tool.annotations
    effect = _effect(override, defaults, annotations)
    upstream_title = tool.title or (annotations.title if annotations else None)
    title = override.title or (shown_text(upstream_title) if upstream_title else None) or defaults.title
    timeout_s = _first(override.timeout_s, defaults.timeout_s, config.timeout_s)
    horizon = override.commit_horizon_s or defaults.commit_horizon_s or config.commit_horizon_s
    check_horizon(f"backend {backend!r} tool {tool.name!r}", timeout_s, horizon)
    return Capability(
        id=f"{backend}.{tool.name}",
        version=_first(override.version, defaults.version, "1"),
        tool_name=config.rename.get(tool.name, tool.name),
        backend=backend,
        # The upstream's words reach clients and models: what a person cannot see in them is marked,
        # in the schemas' descriptions and titles too.
        input_schema=shown_schema(dict(tool.input_schema)),
        effect=effect,
        description=override.description or shown_text(tool.description or "") or defaults.description or "",
        title=title,
        dedupes_on_key=_first(override.dedupes_on_key, defaults.dedupes_on_key, False),
        dedupe_window_s=_first(override.dedupe_window_s, defaults.dedupe_window_s, 600),
        timeout_s=timeout_s,
        commit_horizon_s=horizon,
        redact=_first(override.redact, defaults.redact, ()),
        summary=override.summary or defaults.summary,
        # A read has no effect to learn about, so a backend-wide lookup leaves reads alone.
        reconcilable=effect != "read" and reconcile_setting(config, tool.name) is not None,
        output_schema=shown_schema(dict(tool.output_schema)) if tool.output_schema else None,
        definition=_definition(config, override),
    )


def _definition(config: McpBackend, override: McpToolSettings) -> dict[str, Any]:
    # Only this tool's settings (another tool's override is not this tool's contract), and header and
    # environment names without their values: literal ones may be credentials, and the hash is logged.
    backend = config.model_dump(mode="json", exclude={"overrides", "headers", "env", "rename"})
    backend["headers"] = sorted(config.headers)
    backend["env"] = sorted(config.env)
    return {
        "backend": backend,
        "override": override.model_dump(mode="json", exclude={"description", "title", "summary"}),
    }


def _check_redact(backend: str, tool: mcp_types.Tool, override: McpToolSettings) -> None:
    # A misspelt name redacts nothing: the value it meant would be stored, and shown, in clear.
    # (`defaults.redact` is for every tool, so a tool without one of its fields is fine.)
    properties = tool.input_schema.get("properties")
    if not override.redact or not isinstance(properties, dict):
        return
    unknown = [name for name in override.redact if name not in properties]
    if unknown:
        raise ConfigError(
            f"backend {backend!r}: overrides.{tool.name}.redact names {', '.join(unknown)}, "
            "not in the upstream tool's input schema properties"
        )


def _first(override: _T | None, default: _T | None, fallback: _T) -> _T:
    """The tool's override of a setting, else the backend default's, else `fallback`."""
    if override is not None:
        return override
    return default if default is not None else fallback


def _effect(
    override: McpToolSettings, defaults: McpToolSettings, annotations: mcp_types.ToolAnnotations | None
) -> EffectClass:
    """The operator's word first (the tool's override, then the backend's default), the upstream's
    `readOnlyHint` only where the operator said nothing, and `write` where nobody did.

    MCP calls annotations hints, untrusted unless their server is. A read runs before its intent is
    recorded and a lost answer to it is `failed`, not reconciled, so an upstream's hint may not turn a
    tool the operator declared a write into a read: a tester's `delete_account` marked read-only reached
    the upstream twice under one key, and a changed listing could do so after the operator's review.
    """
    if override.effect is not None:
        return override.effect
    if defaults.effect is not None:
        return defaults.effect
    if annotations is not None and annotations.read_only_hint:
        return "read"
    return "write"
