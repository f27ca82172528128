"""`security.*` events: refusals at the edge, failed authentications, unknown tools and refusals at
Writ's own authorization server, each one standing for a count of refusals of one kind from one source
(the gateway bounds how many are written).

They name no call and change no projection: they are evidence for a security team, exported with the
rest of the log and hash-chained like it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from sqlalchemy import Connection

from store import events as ev
from store.log import Append

SecurityType = Literal[
    "security.auth_failed", "security.unknown_tool", "security.edge_refused", "security.oauth_refused"
]

_EVENTS: dict[
    str,
    type[
        ev.SecurityAuthFailedEvent
        | ev.SecurityUnknownToolEvent
        | ev.SecurityEdgeRefusedEvent
        | ev.SecurityOAuthRefusedEvent
    ],
] = {
    "security.auth_failed": ev.SecurityAuthFailedEvent,
    "security.unknown_tool": ev.SecurityUnknownToolEvent,
    "security.edge_refused": ev.SecurityEdgeRefusedEvent,
    "security.oauth_refused": ev.SecurityOAuthRefusedEvent,
}


@dataclass(frozen=True, slots=True)
class SecurityNote:
    """One `security.*` event to append: `count` refusals of `kind` from `source` in a window."""

    type: SecurityType
    kind: str
    count: int
    first_at: datetime
    last_at: datetime
    window_s: float
    source: str | None = None
    tenant: str | None = None
    issuer: str | None = None
    subject: str | None = None
    tool_name: str | None = None
    path: str | None = None
    client_id: str | None = None
    redirect_host: str | None = None


def record(conn: Connection, notes: Sequence[SecurityNote], *, producer: str) -> list[ev.Event]:
    """Append one event per note, in one transaction; returns the sealed events."""
    log = Append(conn)
    sealed = [
        log.add(
            _EVENTS[note.type](
                occurred_at=ev.format_ts(note.last_at),
                producer=producer,
                tenant=note.tenant,
                payload=ev.SecurityNoted(
                    kind=note.kind,
                    source=note.source,
                    count=note.count,
                    first_at=ev.format_ts(note.first_at),
                    last_at=ev.format_ts(note.last_at),
                    window_s=note.window_s,
                    issuer=note.issuer,
                    subject=note.subject,
                    tool_name=note.tool_name,
                    path=note.path,
                    client_id=note.client_id,
                    redirect_host=note.redirect_host,
                ),
            )
        )
        for note in notes
    ]
    log.flush()
    return sealed
