"""The audit export's query: events of one tenant, time range, types, principal or capability, by seq.

Read in keyset pages after a cursor (`after_seq`), so an export streams a long log without holding it,
and a follower resumes after the last seq it wrote.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, or_, select

from store.events import format_ts
from store.schema import events, runs, tool_calls


@dataclass(frozen=True, slots=True)
class EventFilter:
    """Which events an export carries; each field left empty does not filter.

    `types` are exact event types or prefixes written `tool_call.*`; `since` is inclusive and `until`
    exclusive, on `occurred_at`; `subject` keeps the events of that principal's runs and calls.
    """

    tenant: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    types: tuple[str, ...] = ()
    subject: str | None = None
    capability_id: str | None = None

    def keys(self) -> tuple[str | None, ...]:
        """The text this filter looks up, to check it is text a row can hold."""
        return (self.tenant, self.subject, self.capability_id, *self.types)


def conditions(given: EventFilter) -> list[ColumnElement[bool]]:
    """The WHERE clauses of `given` over the events table."""
    c = events.c
    found: list[ColumnElement[bool]] = []
    if given.tenant is not None:
        found.append(c.tenant == given.tenant)
    if given.since is not None:
        found.append(c.occurred_at >= format_ts(given.since))
    if given.until is not None:
        found.append(c.occurred_at < format_ts(given.until))
    if given.types:
        exact = [t for t in given.types if not t.endswith("*")]
        prefixes = [t[:-1] for t in given.types if t.endswith("*")]
        # `_` and `%` in a type are literal, not LIKE wildcards (tool_call.* must not match toolXcall.).
        either: list[Any] = [c.type.startswith(p, autoescape=True) for p in prefixes]
        if exact:
            either.append(c.type.in_(exact))
        found.append(or_(*either))
    if given.capability_id is not None:
        found.append(c.capability_id == given.capability_id)
    if given.subject is not None:
        own_runs = select(runs.c.run_id).where(runs.c.subject == given.subject)
        own_calls = select(tool_calls.c.tool_call_id).where(tool_calls.c.subject == given.subject)
        if given.tenant is not None:
            own_runs = own_runs.where(runs.c.tenant == given.tenant)
            own_calls = own_calls.where(tool_calls.c.tenant == given.tenant)
        found.append(or_(c.run_id.in_(own_runs), c.tool_call_id.in_(own_calls)))
    return found
