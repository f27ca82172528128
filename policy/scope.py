"""Which calls a rule or a budget covers: tools (or resources, prompts), roles, subjects, tenants and
effect classes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fnmatch import fnmatchcase
from typing import Any, Protocol

from capabilities.contract import Capability

from .model import Principal


class Scoped(Protocol):
    @property
    def tools(self) -> Sequence[str]: ...

    @property
    def resources(self) -> Sequence[str] | None: ...

    @property
    def prompts(self) -> Sequence[str] | None: ...

    @property
    def roles(self) -> Sequence[str] | None: ...

    @property
    def subjects(self) -> Sequence[str] | None: ...

    @property
    def tenants(self) -> Sequence[str] | None: ...

    @property
    def effects(self) -> Sequence[str] | None: ...


def in_scope(
    scoped: Scoped, principal: Principal, capability: Capability, arguments: Mapping[str, Any] | None = None
) -> bool:
    """Whether `scoped` covers calls of `capability` by `principal` (omitted fields match anything).

    A rule covers one kind of request: tool calls (`tools`), resource reads (`resources`, URI patterns
    matched against the read's `uri` argument) or prompt gets (`prompts`); one naming resources or
    prompts covers no tool, and one naming neither covers no resource or prompt.
    """
    if not _targets(scoped, capability, arguments or {}):
        return False
    if scoped.roles is not None and principal.roles.isdisjoint(scoped.roles):
        return False
    if scoped.subjects is not None and principal.subject not in scoped.subjects:
        return False
    if scoped.tenants is not None and principal.tenant not in scoped.tenants:
        return False
    return scoped.effects is None or capability.effect in scoped.effects


def _targets(scoped: Scoped, capability: Capability, arguments: Mapping[str, Any]) -> bool:
    names: tuple[str, ...]
    if capability.kind == "resource":
        uri = arguments.get("uri")
        patterns, names = scoped.resources, (uri,) if isinstance(uri, str) else ()
    elif capability.kind == "prompt":
        patterns = scoped.prompts
        names = (capability.tool_name, capability.id, capability.ref)
    else:
        if scoped.resources is not None or scoped.prompts is not None:
            return False
        patterns, names = scoped.tools, (capability.tool_name, capability.id, capability.ref)
    return patterns is not None and any(fnmatchcase(name, pattern) for pattern in patterns for name in names)
