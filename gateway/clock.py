"""The one reading of the wall clock for business time (decisions, expiries, records).

Only the composition roots (the app factory, the CLI's entry) take `system_clock` and hand it in; every
other module is given a `Clock`, so a test can run it at any instant. Monotonic timers for timeouts
read their own clock.

Replicas of one PostgreSQL store judge each other's work by time: a dispatch lease another replica
took has run out, a call's commit horizon has passed. Each reads its own host's clock, so one whose
clock is 20 s ahead settled another's call in flight `failed`. `SharedClock` keeps business time by the
database server's clock instead, the one clock every replica shares: the server's time as last
measured (`measure`, now and again), carried forward by this host's monotonic clock, which NTP or an
operator stepping the wall clock does not move.
"""

from __future__ import annotations

import logging
import threading
import time
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
    """Business time by the database server's clock: the server's time at the last measurement plus the
    time elapsed since by `monotonic`.

    Until a measurement succeeds, and for a store with no server of its own (SQLite, whose processes
    share their host's clock), it is `base` itself. Once measured, a step of the host's wall clock
    (`base`) does not move it: read as `base` plus the offset, a clock stepped minutes ahead put this
    replica minutes ahead until the next measurement, and it took over other replicas' leases and
    settled calls whose horizon had not passed.
    """

    def __init__(self, base: Clock = system_clock, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._base = base
        self._monotonic = monotonic
        self._offset = timedelta(0)
        self._anchor: tuple[datetime, float] | None = None
        """The server's time, and the monotonic reading at the same instant, of the last measurement."""
        self._said: timedelta | None = None
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        anchor = self._anchor
        if anchor is None:
            return self._base()
        at_server, at_monotonic = anchor
        return at_server + timedelta(seconds=self._monotonic() - at_monotonic)

    @property
    def offset(self) -> timedelta:
        """The server's clock less this host's wall clock, as last measured."""
        return self._offset

    def measure(self, server_time: Callable[[], datetime | None], samples: int = 3) -> Offset | None:
        """Measure the offset to `server_time` (None: there is no server clock) and keep time by it.

        Of `samples` round trips, the shortest bounds the error best (by half of it). A failure to reach
        the server raises and keeps the time measured last.
        """
        best: tuple[Offset, datetime, float] | None = None
        for _ in range(samples):
            left = self._monotonic()
            sent = self._base()
            at_server = server_time()
            back = self._monotonic()
            if at_server is None:
                return None
            # Timed by the monotonic clock: a step of the wall clock meanwhile only skews the offset told.
            round_trip = timedelta(seconds=back - left)
            offset = Offset(at_server - (sent + round_trip / 2), round_trip)
            if best is None or offset.round_trip < best[0].round_trip:
                best = (offset, at_server, (left + back) / 2)
        if best is not None:
            with self._lock:
                self._offset = best[0].offset
                self._anchor = (best[1], best[2])
                self._say(best[0])
        return best[0] if best is not None else None

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
