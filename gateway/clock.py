"""The one reading of the wall clock for business time (decisions, expiries, records).

Only the composition roots (the app factory, the CLI's entry) take `system_clock` and hand it in; every
other module is given a `Clock`, so a test can run it at any instant. Monotonic timers for timeouts
read their own clock.

Replicas of one PostgreSQL store judge each other's work by time: a dispatch lease another replica
took has run out, a call's commit horizon has passed. Each reads its own host's clock, so one whose
clock is 20 s ahead settled another's call in flight `failed`. `SharedClock` keeps business time by the
database server's clock instead, the one clock every replica shares: this host's wall clock plus the
offset to the server's, measured now and again (`measure`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

logger = logging.getLogger(__name__)

Clock = Callable[[], datetime]
"""Now, as an aware UTC datetime."""

OFFSET_WORTH_SAYING = timedelta(seconds=1)
"""An offset from the database's clock above this is logged as a warning: the host's clock is off."""


def system_clock() -> datetime:
    """The wall clock, in UTC."""
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class Offset:
    """The database server's clock less this host's, as one round trip measured it."""

    offset: timedelta
    round_trip: timedelta

    def text(self) -> str:
        seconds = self.offset.total_seconds()
        way = "behind" if seconds > 0 else "ahead of"
        return (
            f"this host's clock is {abs(seconds):.3f} s {way} the database server's "
            f"(measured within {self.round_trip.total_seconds() / 2:.3f} s)"
        )


class SharedClock:
    """Business time by the database server's clock: `base` (this host's) plus the measured offset.

    Until a measurement succeeds, and for a store with no server of its own (SQLite, whose processes
    share their host's clock), it is `base` itself.
    """

    def __init__(self, base: Clock = system_clock) -> None:
        self._base = base
        self._offset = timedelta(0)
        self._said: timedelta | None = None
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        return self._base() + self._offset

    @property
    def offset(self) -> timedelta:
        return self._offset

    def measure(self, server_time: Callable[[], datetime | None], samples: int = 3) -> Offset | None:
        """Measure the offset to `server_time` (None: there is no server clock) and keep time by it.

        Of `samples` round trips, the shortest bounds the error best (by half of it). A failure to reach
        the server raises and keeps the offset measured last.
        """
        best: Offset | None = None
        for _ in range(samples):
            sent = self._base()
            at_server = server_time()
            back = self._base()
            if at_server is None:
                return None
            round_trip = back - sent
            if round_trip < timedelta(0):  # the host's clock was stepped meanwhile: not a measurement
                continue
            offset = Offset(at_server - (sent + round_trip / 2), round_trip)
            if best is None or offset.round_trip < best.round_trip:
                best = offset
        if best is not None:
            with self._lock:
                self._offset = best.offset
                self._say(best)
        return best

    def _say(self, measured: Offset) -> None:
        """Warn when the host's clock is off (once, and again when it changes by as much again)."""
        off = abs(measured.offset) > OFFSET_WORTH_SAYING
        if off and (self._said is None or abs(measured.offset - self._said) > OFFSET_WORTH_SAYING):
            logger.warning(
                "%s: Writ keeps leases, commit horizons, expiries and its events' times by the database's "
                "clock, which every replica shares; synchronise this host's clock all the same (NTP), "
                "since a backend that honours Writ-Commit-Deadline compares it with its own",
                measured.text(),
            )
            self._said = measured.offset
        elif not off and self._said is not None:
            logger.info("%s: the host's clock agrees with the database's again", measured.text())
            self._said = None
