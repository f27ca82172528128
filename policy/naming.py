"""Which `tools` entries of a policy name no capability Writ has.

A rule covers the calls whose tool name, capability id or `id@version` ref its `tools` entries match.
An entry that matches none covers nothing, and says nothing about it. Where that fails open it is
dangerous: a rule that sends refunds over 100 to a person, written `tools: [refund_ordr]`, lets every
refund through on the next rule's allow; a misspelled deny, budget or loop rule likewise holds nothing
back. A misspelled allow fails closed (the call is denied by default) and may as well name a tool an
upstream has yet to offer. `unmatched_tools` finds every such entry, with the names it is closest to;
the gateway refuses a plain name that fails open and warns of the rest.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase

from capabilities.contract import Capability

from .rules import PolicyConfig

_GLOB = frozenset("*?[")


@dataclass(frozen=True)
class Unmatched:
    """One `tools` entry that matches no capability, and where it is."""

    owner: str
    """`rule 'refunds-over-100'`, `budget 'daily-spend'` or `loop rule 'same-refund'`."""
    entry: str
    fails_open: bool
    """Whether covering nothing lets calls through that the entry meant to hold back: a deny or
    approval rule, a budget, a loop rule (not an allow rule, whose calls are then denied)."""
    close: tuple[str, ...] = ()
    """The capabilities' names nearest to a plain name (difflib), best first."""

    @property
    def is_glob(self) -> bool:
        return not _GLOB.isdisjoint(self.entry)

    @property
    def refuses_start(self) -> bool:
        """A plain name that fails open: the gateway refuses it; the rest it warns of."""
        return self.fails_open and not self.is_glob

    def __str__(self) -> str:
        hint = f" (did you mean {' or '.join(repr(name) for name in self.close)}?)" if self.close else ""
        return f"{self.owner} names tool {self.entry!r}, which no capability has{hint}"


def tool_names(capabilities: Iterable[Capability]) -> set[str]:
    """What a `tools` entry may match: each tool's name, capability id and `id@version` ref."""
    return {n for c in capabilities if c.kind == "tool" for n in (c.tool_name, c.id, c.ref)}


def unmatched_tools(config: PolicyConfig, names: Collection[str]) -> list[Unmatched]:
    """Every `tools` entry of the rules, budgets and loop rules that matches none of `names` (the tool
    names, ids and refs of the capabilities in force), in the order the policy lists them.

    A rule about resources or prompts has no tools to check; `*` matches whatever there is.
    """
    found: list[Unmatched] = []
    for owner, entries, fails_open in _scopes(config):
        for entry in entries:
            if entry == "*" or any(fnmatchcase(name, entry) for name in names):
                continue
            plain = _GLOB.isdisjoint(entry)
            close = tuple(difflib.get_close_matches(entry, sorted(names), n=2)) if plain else ()
            found.append(Unmatched(owner, entry, fails_open, close))
    return found


def _scopes(config: PolicyConfig) -> Iterator[tuple[str, Sequence[str], bool]]:
    for rule in config.rules:
        if rule.kind == "tool":
            yield f"rule {rule.id!r}", rule.tools, rule.decision != "allow"
    for budget in config.budgets:
        yield f"budget {budget.id!r}", budget.tools, True
    for loop in config.loops:
        yield f"loop rule {loop.id!r}", loop.tools, True
