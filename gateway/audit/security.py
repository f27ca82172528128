"""Rate-bounded `security.*` events: failed authentications, unknown tools and refusals at the edge.

The request path only counts (`note`: no I/O, constant time); a background pass writes the counts to
the log. The rule, per replica: for each key (event type, kind, client address, and the identity or
tool the refusal names), at most one event per `window_s`, carrying the number of refusals it stands
for and the first and last of them. A key's first refusal after a quiet window is written on the next
pass; the refusals after it wait until its window has passed and then make one event. At most
`max_keys` keys are tracked: past that, a new key's refusals are counted under its type and kind with
the source `other` and no detail. So a flood of bad tokens costs a dictionary update per request and
at most (keys x duration / window) events, however many requests it sends.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

import anyio.to_thread

from gateway.clock import Clock
from store.model import StoreError
from store.ports import SecurityLog
from store.security import SecurityNote, SecurityType

logger = logging.getLogger(__name__)

OTHER_SOURCE = "other"
MAX_TEXT = 128


def shown(text: object) -> str | None:
    """Client-chosen text as a security event may hold it: printable, at most `MAX_TEXT` characters."""
    if not isinstance(text, str) or not text:
        return None
    cleaned = "".join(c if c.isprintable() else "?" for c in text[:MAX_TEXT])
    return cleaned + ("..." if len(text) > MAX_TEXT else "")


@dataclass(frozen=True, slots=True)
class SecurityRefusal:
    """One refusal the gateway saw; equal refusals are counted together."""

    type: SecurityType
    kind: str
    source: str | None = None
    tenant: str | None = None
    issuer: str | None = None
    subject: str | None = None
    tool_name: str | None = None
    path: str | None = None
    client_id: str | None = None
    redirect_host: str | None = None


@dataclass(slots=True)
class _Tally:
    count: int
    first_at: datetime
    last_at: datetime


class SecurityEvents:
    """Counts refusals as they happen and writes them to the log, at most one event per key and window."""

    def __init__(
        self,
        log: SecurityLog,
        clock: Clock,
        *,
        window_s: float = 60.0,
        max_keys: int = 1000,
        counted: Callable[[str, str], None] | None = None,
    ) -> None:
        self._log = log
        self._counted = counted
        """Told of every refusal as it happens (a metric), before the rate bound the log keeps."""
        self._clock = clock
        self._window = timedelta(seconds=window_s)
        self._max_keys = max_keys
        self._pending: dict[SecurityRefusal, _Tally] = {}
        self._written: dict[SecurityRefusal, datetime] = {}
        self._keys: set[SecurityRefusal] = set()
        """Every key pending or written within its window: what `max_keys` bounds."""
        # `note` runs on the server's event loop, a pass may run elsewhere (on the way out, or from
        # another thread): one short lock, never held across I/O.
        self._lock = threading.Lock()
        self._passing = threading.Lock()

    @property
    def window_s(self) -> float:
        return self._window.total_seconds()

    def note(self, refusal: SecurityRefusal) -> None:
        """Count one refusal; nothing is written here."""
        if self._counted is not None:
            self._counted(refusal.type, refusal.kind)
        now = self._clock()
        with self._lock:
            if refusal not in self._keys and len(self._keys) >= self._max_keys:
                refusal = SecurityRefusal(refusal.type, refusal.kind, OTHER_SOURCE, tenant=refusal.tenant)
            self._keys.add(refusal)
            tally = self._pending.get(refusal)
            if tally is None:
                self._pending[refusal] = _Tally(1, now, now)
            else:
                tally.count += 1
                tally.last_at = now

    def due(self, *, flush_all: bool = False) -> list[SecurityNote]:
        """Take the counts whose key's window has passed (all of them with `flush_all`)."""
        now = self._clock()
        taken: list[SecurityNote] = []
        with self._lock:
            for refusal, tally in list(self._pending.items()):
                written = self._written.get(refusal)
                if flush_all or written is None or now - written >= self._window:
                    del self._pending[refusal]
                    self._written[refusal] = now
                    taken.append(_note(refusal, tally, self.window_s))
            self._forget_quiet(now)
        return taken

    def _forget_quiet(self, now: datetime) -> None:
        # Under `_lock`. A key quiet for a window: its next refusal is written at once.
        for refusal, written in list(self._written.items()):
            if refusal not in self._pending and now - written >= self._window:
                del self._written[refusal]
                self._keys.discard(refusal)

    def _idle(self) -> bool:
        """Whether nothing is pending (forgetting the keys quiet for a window meanwhile, in memory)."""
        with self._lock:
            if self._pending:
                return False
            self._forget_quiet(self._clock())
            return True

    async def tick(self, *, flush_all: bool = False) -> int:
        """One pass: write what is due; returns the number of events written.

        Raises:
            StoreError: the store could not take them; they are counted again for the next pass.
        """
        if not flush_all and self._idle():
            return 0  # nothing to write: no worker thread (a pass in flight writes what it took)
        notes = await anyio.to_thread.run_sync(self._write_due, flush_all)
        for note in notes:
            logger.warning(
                "%s kind=%s source=%s count=%d tenant=%s%s",
                note.type,
                note.kind,
                note.source,
                note.count,
                note.tenant,
                "".join(f" {k}={v}" for k, v in _details(note)),
                extra={"writ_event": note.type, "writ_kind": note.kind, "writ_count": note.count},
            )
        return len(notes)

    def _write_due(self, flush_all: bool) -> list[SecurityNote]:
        # One pass at a time, from taking what is due to its commit: a pass asked for (`flush_all`, at
        # shutdown) returns only once what an earlier pass took is written too. Held in a worker
        # thread, never on an event loop.
        with self._passing:
            notes = self.due(flush_all=flush_all)
            if not notes:
                return []
            try:
                self._log.record_security(notes)
            except StoreError:
                self._restore(notes)
                raise
            return notes

    def _restore(self, notes: Sequence[SecurityNote]) -> None:
        with self._lock:
            for note in notes:
                refusal = SecurityRefusal(
                    note.type,
                    note.kind,
                    note.source,
                    note.tenant,
                    note.issuer,
                    note.subject,
                    note.tool_name,
                    note.path,
                    note.client_id,
                    note.redirect_host,
                )
                self._written.pop(refusal, None)
                self._keys.add(refusal)
                tally = self._pending.get(refusal)
                if tally is None:
                    self._pending[refusal] = _Tally(note.count, note.first_at, note.last_at)
                else:
                    tally.count += note.count
                    tally.first_at = min(tally.first_at, note.first_at)


def _note(refusal: SecurityRefusal, tally: _Tally, window_s: float) -> SecurityNote:
    return SecurityNote(
        type=refusal.type,
        kind=refusal.kind,
        count=tally.count,
        first_at=tally.first_at,
        last_at=tally.last_at,
        window_s=window_s,
        source=refusal.source,
        tenant=refusal.tenant,
        issuer=refusal.issuer,
        subject=refusal.subject,
        tool_name=refusal.tool_name,
        path=refusal.path,
        client_id=refusal.client_id,
        redirect_host=refusal.redirect_host,
    )


def _details(note: SecurityNote) -> list[tuple[str, str]]:
    named = {
        "issuer": note.issuer,
        "subject": note.subject,
        "tool": note.tool_name,
        "path": note.path,
        "client_id": note.client_id,
        "redirect_host": note.redirect_host,
    }
    return [(k, v) for k, v in named.items() if v is not None]


class SecuritySink(Protocol):
    """Where the edge, the authentication and the MCP face note what they refuse."""

    def note(self, refusal: SecurityRefusal) -> None: ...


class NoSecurityEvents:
    """What a component is given when no events are kept (unit tests, the CLI)."""

    def note(self, refusal: SecurityRefusal) -> None:
        pass


__all__ = ["NoSecurityEvents", "SecurityRefusal", "SecurityEvents", "SecuritySink", "shown"]
