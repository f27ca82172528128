"""Which calls of the process are about to commit: what the group writer may wait for.

A call announces, as it enters the pipeline, how many commits it will make at most (`Coming`); while
it has one left, is not waiting for one of its own to commit, and is not away at its backend
(`away`), it is *coming*: working its way, on this process's CPU, toward its next commit. The group
writer (store.batching) holds a transaction back, within a small bound, only while some call is
coming, so that one COMMIT serves it too. A call alone in the process is never coming while its own
write waits, so one client's sequential calls never wait for company.

A call away at its backend is waited for only when it is *due back*: each backend's usual answer
time is learnt (`AwayTimes`, per capability, as TCP learns a round trip time), and a call whose
expected return falls within what is left of the writer's bound is waited for, until it is late by
more than the backend's usual spread. A slow backend is thus soon not waited for at all (its
estimate outgrows the bound), and a call stuck at a backend is given up on as it turns late.

The count is a hint for the writer, never a promise: a call that ends without its commits (refused,
joined, failed) gives back what it had left when it ends, and the writer never waits past its bound.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from dataclasses import dataclass
from types import TracebackType

_current: ContextVar[Coming | None] = ContextVar("writ_store_coming", default=None)

LATE_SPREADS = 2.0
"""A call away longer than its backend's usual time plus this many usual spreads is late: not waited for."""

LATE_SHARE = 0.25
"""...and at least this share of the usual time (a backend whose times never vary has no spread)."""


@dataclass(slots=True)
class _Estimate:
    mean: float
    spread: float


class AwayTimes:
    """How long each backend usually keeps a call away: a moving mean and mean deviation per key.

    The estimator TCP uses for round trip times (RFC 6298): the first answer time is the mean and half
    of it the spread; each later one moves the mean by an eighth of its difference, the spread by a
    quarter of how far it strays. A backend that turns slow is thus learnt within a few calls.
    """

    GAIN = 1 / 8
    SPREAD_GAIN = 1 / 4

    def __init__(self) -> None:
        self._estimates: dict[str, _Estimate] = {}

    def observe(self, key: str, seconds: float) -> None:
        """One call to `key`'s backend took `seconds`, answered or not."""
        estimate = self._estimates.get(key)
        if estimate is None:
            self._estimates[key] = _Estimate(seconds, seconds / 2)
            return
        estimate.spread += self.SPREAD_GAIN * (abs(seconds - estimate.mean) - estimate.spread)
        estimate.mean += self.GAIN * (seconds - estimate.mean)

    def due(self, key: str, left_at: float) -> Due | None:
        """When a call that left for `key`'s backend at `left_at` is expected back, and late; None: no
        call of it has come back yet."""
        estimate = self._estimates.get(key)
        if estimate is None:
            return None
        back_at = left_at + estimate.mean
        return Due(back_at, back_at + max(LATE_SPREADS * estimate.spread, LATE_SHARE * estimate.mean))


@dataclass(frozen=True, slots=True)
class Due:
    """When a call away at its backend is expected back, and from when it is late."""

    back_at: float
    late_at: float


class Arrivals:
    """The process-wide count of calls coming, under the condition the group writer waits on."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        """Seconds, monotonic: when calls leave for and come back from their backends, and the writer's
        bound (injected by tests)."""
        self.condition = threading.Condition()
        self.coming: set[Coming] = set()
        """Calls coming now (read and changed under `condition`)."""
        self.away: dict[Coming, Due] = {}
        """Calls away at a backend whose usual time is known, with a commit left (under `condition`)."""
        self.times = AwayTimes()
        """Each backend's usual answer time (under `condition`)."""
        self.announced = False
        """Whether any call ever announced itself: then the writer knows who is coming, and only waits
        for them."""
        self.watched = False
        """Whether the writer is waiting for those coming now (only then does a departure wake it)."""

    def awaitable(self, now: float, deadline: float) -> set[Coming]:
        """The calls a transaction held back until `deadline` may wait for at `now`: those coming, and
        those away that are due back by then and not late (called under `condition`)."""
        due = {
            coming for coming, when in self.away.items() if when.back_at <= deadline and now < when.late_at
        }
        return self.coming | due

    def late_at(self, calls: Iterable[Coming]) -> float:
        """The first moment one of `calls` that is away turns late (infinity: none is away)."""
        return min((when.late_at for coming in calls if (when := self.away.get(coming))), default=math.inf)

    def _move(self, coming: Coming, now: bool, due: Due | None) -> None:
        with self.condition:
            left = False
            if now:
                self.coming.add(coming)
            elif coming in self.coming:
                self.coming.discard(coming)
                left = True
            if due is not None:
                self.away[coming] = due
            elif self.away.pop(coming, None) is not None:
                left = True
            if left and self.watched and coming not in self.coming and coming not in self.away:
                self.condition.notify_all()


class Coming:
    """One call's announcement: at most `commits` commits, the first of them on their way now."""

    def __init__(self, arrivals: Arrivals, commits: int) -> None:
        self._arrivals = arrivals
        self._left = commits
        self._waiting = False
        self._away: Due | bool = False
        """False, or away at its backend: when it is due back there (True: not known)."""
        self._counted: tuple[bool, Due | None] = (False, None)
        self._reset: Token[Coming | None] | None = None

    def __enter__(self) -> Coming:
        self._arrivals.announced = True
        self._reset = _current.set(self)
        self._recount()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._left = 0
        self._recount()
        if self._reset is not None:
            _current.reset(self._reset)
            self._reset = None

    def _recount(self) -> None:
        pending = self._left > 0 and not self._waiting
        counted = (
            pending and self._away is False,
            self._away if pending and isinstance(self._away, Due) else None,
        )
        if counted != self._counted:
            self._counted = counted
            self._arrivals._move(self, *counted)

    def submitted(self, enqueue: Callable[[], None]) -> None:
        """Its next write is queued (by `enqueue`, under the writer's condition): not coming until it
        has been answered."""
        with self._arrivals.condition:
            enqueue()
            self._left = max(0, self._left - 1)
            self._waiting = True
            self._recount()

    def also(self, commits: int) -> None:
        """It turned out to make `commits` more (a write's outcome after its admission)."""
        self._left += commits
        self._recount()

    def answered(self) -> None:
        """Its write committed (or failed), and the call goes on: coming again if it has commits left."""
        self._waiting = False
        self._recount()

    @contextmanager
    def away_now(self, backend: str) -> Iterator[None]:
        """Waiting on `backend`, not this process: not coming meanwhile, only due back (`AwayTimes`)."""
        arrivals = self._arrivals
        was = self._away
        with arrivals.condition:
            left_at = arrivals.clock()
            self._away = arrivals.times.due(backend, left_at) or True
            self._recount()
        try:
            yield
        finally:
            with arrivals.condition:
                arrivals.times.observe(backend, arrivals.clock() - left_at)
                self._away = was
                self._recount()


def current() -> Coming | None:
    """The announcement of the call running in this context, if it made one."""
    return _current.get()


@contextmanager
def away(backend: str) -> Iterator[None]:
    """Around a call's wait on `backend` (a capability): the writer waits for it meanwhile only while
    it is due back (`AwayTimes`)."""
    coming = _current.get()
    if coming is None:
        yield
        return
    with coming.away_now(backend):
        yield
