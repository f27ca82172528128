"""The audit export both faces share: reading filter values people type, JSON lines, and following.

`writ audit export` and `GET /api/audit/events` take the same filters (store.exporting.EventFilter);
this turns what a person or a SIEM sends into one, refusing what is not a time or an event type, and
writes events as Writ's JSON lines. `follow` polls after the last seq written until told to stop: the
log commits in seq order (each seq is taken under the head's lock), so a poll never skips an event.
"""

from __future__ import annotations

import json
import re
import signal
import threading
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any, TextIO

from gateway.audit.ocsf import ocsf_event
from gateway.errors import Refused
from gateway.reasons import ReasonCode
from store.exporting import EventFilter
from store.ports import AuditExport

# An event type (`tool_call.completed`) or a prefix of one's dotted parts (`tool_call.*`, `*`).
_TYPE = re.compile(r"\*|[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*(\.\*)?", re.ASCII)


def moment(name: str, text: str) -> datetime:
    """An ISO 8601 time with its offset (`2026-12-01T00:00:00Z`).

    Raises:
        Refused: `text` is not such a time (a time without an offset would be read in some zone).
    """
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise Refused(ReasonCode.INVALID_REQUEST, f"{name}: {text!r} is not an ISO 8601 time") from None
    if parsed.tzinfo is None:
        raise Refused(ReasonCode.INVALID_REQUEST, f"{name}: {text!r} needs an offset, e.g. {text}Z for UTC")
    return parsed.astimezone(UTC)


def event_types(given: Iterable[str]) -> tuple[str, ...]:
    """Event types as given, each exact or a prefix ending in `.*`; `*` alone is every type.

    Raises:
        Refused: one is not an event type nor such a prefix.
    """
    types = tuple(given)
    for text in types:
        if not _TYPE.fullmatch(text):
            raise Refused(
                ReasonCode.INVALID_REQUEST,
                f"type: {text!r} is not an event type (tool_call.completed) or a prefix (tool_call.*)",
            )
    return () if "*" in types else types


def event_filter(
    *,
    tenant: str | None = None,
    since: str | None = None,
    until: str | None = None,
    types: Iterable[str] = (),
    principal: str | None = None,
    capability: str | None = None,
) -> EventFilter:
    """The filter these values name.

    Raises:
        Refused: a time or a type is not one, or `since` is not before `until`.
    """
    start = moment("since", since) if since is not None else None
    end = moment("until", until) if until is not None else None
    if start is not None and end is not None and start >= end:
        raise Refused(ReasonCode.INVALID_REQUEST, "since must be before until")
    return EventFilter(
        tenant=tenant,
        since=start,
        until=end,
        types=event_types(types),
        subject=principal,
        capability_id=capability,
    )


def json_line(event: dict[str, Any]) -> str:
    """One event as one line of Writ's JSON lines."""
    return json.dumps(event, sort_keys=True, default=str) + "\n"


Line = Callable[[dict[str, Any]], str]
"""How an event is written: `json_line`, or `ocsf_line` for OCSF."""


def ocsf_line(event: dict[str, Any]) -> str:
    """One event as one line of OCSF JSON (gateway.audit.ocsf)."""
    return json_line(ocsf_event(event))


def write_events(
    log: AuditExport, given: EventFilter, after_seq: int, out: TextIO, line: Line = json_line
) -> int:
    """Write what `given` selects after `after_seq`, flushed; the last seq written (else `after_seq`)."""
    for event in log.export(given, after_seq=after_seq):
        out.write(line(event))
        after_seq = event["seq"]
    out.flush()
    return after_seq


def follow(
    log: AuditExport,
    given: EventFilter,
    after_seq: int,
    out: TextIO,
    *,
    stop: threading.Event,
    interval: float = 1.0,
    line: Line = json_line,
) -> int:
    """Write what `given` selects, then what commits later, every `interval` seconds until `stop` is
    set; the last seq written (else `after_seq`), so a follower can resume after it."""
    while True:
        after_seq = write_events(log, given, after_seq, out, line)
        if stop.wait(interval):
            return after_seq


def follow_until_signalled(
    log: AuditExport,
    given: EventFilter,
    after_seq: int,
    out: TextIO,
    *,
    interval: float,
    line: Line = json_line,
) -> int:
    """`follow` until Ctrl-C or SIGTERM, which end it cleanly after the line being written."""
    stop = threading.Event()
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        return follow(log, given, after_seq, out, stop=stop, interval=interval, line=line)
    except KeyboardInterrupt:
        out.flush()
        return after_seq
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
