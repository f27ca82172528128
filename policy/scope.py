"""Which calls a rule or a budget covers: tools, roles, subjects, tenants and effect classes."""

from __future__ import annotations

from collections.abc import Sequence
from fnmatch import fnmatchcase
from typing import Protocol

from capabilities.contract import Capability

from .model import Principal


class Scoped(Protocol):
    @property
    def tools(self) -> Sequence[str]: ...

    @property
    def roles(self) -> Sequence[str] | None: ...

    @property
    def subjects(self) -> Sequence[str] | None: ...

    @property
    def tenants(self) -> Sequence[str] | None: ...

    @property
    def effects(self) -> Sequence[str] | None: ...


def in_scope(scoped: Scoped, principal: Principal, capability: Capability) -> bool:
    """Whether `scoped` covers calls of `capability` by `principal` (omitted fields match anything)."""
    names = (capability.tool_name, capability.id, capability.ref)
    if not any(fnmatchcase(name, pattern) for pattern in scoped.tools for name in names):
        return False
    if scoped.roles is not None and principal.roles.isdisjoint(scoped.roles):
        return False
    if scoped.subjects is not None and principal.subject not in scoped.subjects:
        return False
    if scoped.tenants is not None and principal.tenant not in scoped.tenants:
        return False
    return scoped.effects is None or capability.effect in scoped.effects
