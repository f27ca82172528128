"""Which calls of the process are about to commit: what the group writer may wait for.

A call announces, as it enters the pipeline, how many commits it will make at most (`Coming`); while
it has one left, is not waiting for one of its own to commit, and is not away at its backend
(`away`), it is *coming*: working its way, on this process's CPU, toward its next commit. The group
writer (store.batching) holds a transaction back, within a small bound, only while some call is
coming, so that one COMMIT serves it too. A call alone in the process is never coming while its own
write waits, so one client's sequential calls never wait for company.

The count is a hint for the writer, never a promise: a call that ends without its commits (refused,
joined, failed) gives back what it had left when it ends, and the writer never waits past its bound.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from types import TracebackType

_current: ContextVar[Coming | None] = ContextVar("writ_store_coming", default=None)


class Arrivals:
    """The process-wide count of calls coming, under the condition the group writer waits on."""

    def __init__(self) -> None:
        self.condition = threading.Condition()
        self.coming: set[Coming] = set()
        """Calls coming now (read and changed under `condition`)."""
        self.announced = False
        """Whether any call ever announced itself: then the writer knows who is coming, and only waits
        for them."""
        self.watched = False
        """Whether the writer is waiting for those coming now (only then does a departure wake it)."""

    def _move(self, coming: Coming, now: bool) -> None:
        with self.condition:
            if now:
                self.coming.add(coming)
            else:
                self.coming.discard(coming)
                if self.watched:
                    self.condition.notify_all()


class Coming:
    """One call's announcement: at most `commits` commits, the first of them on their way now."""

    def __init__(self, arrivals: Arrivals, commits: int) -> None:
        self._arrivals = arrivals
        self._left = commits
        self._waiting = False
        self._away = False
        self._counted = False
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
        counted = self._left > 0 and not self._waiting and not self._away
        if counted != self._counted:
            self._counted = counted
            self._arrivals._move(self, counted)

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
    def away_now(self) -> Iterator[None]:
        """Waiting on something other than this process (its backend): not coming meanwhile."""
        was, self._away = self._away, True
        self._recount()
        try:
            yield
        finally:
            self._away = was
            self._recount()


def current() -> Coming | None:
    """The announcement of the call running in this context, if it made one."""
    return _current.get()


@contextmanager
def away() -> Iterator[None]:
    """Around a call's wait on its backend: the writer does not wait for it meanwhile."""
    coming = _current.get()
    if coming is None:
        yield
        return
    with coming.away_now():
        yield
