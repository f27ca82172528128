"""Test-only fault points: make this process die (or freeze) at a named durable boundary of a call.

Read once at startup from the environment, and inert unless set:

    WRIT_FAULT_CRASH_AT=<point>[:<nth>]   os._exit(137) the nth time the point is reached (default 1st)
    WRIT_FAULT_STOP_AT=<point>[:<nth>]    SIGSTOP this process there (a test SIGCONTs it later)

`os._exit` runs no cleanup, flushes nothing and answers no one: as close to SIGKILL as a process can do
to itself, at an exact place. The fault suite (tests/faults) uses it to prove the resume contract.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, get_args

logger = logging.getLogger(__name__)

FaultPoint = Literal["after_dispatching_commit", "after_execute", "after_outcome_commit"]
"""After the intent + dispatching commit; after the executor returned, before the outcome commit;
after the outcome commit, before the client is answered."""
POINTS: tuple[str, ...] = get_args(FaultPoint)
CRASH_ENV = "WRIT_FAULT_CRASH_AT"
STOP_ENV = "WRIT_FAULT_STOP_AT"
CRASH_EXIT_CODE = 137


def _parse(spec: str | None, env: str) -> tuple[str, int] | None:
    if not spec:
        return None
    point, _, nth = spec.partition(":")
    if point not in POINTS:
        raise ValueError(f"{env}: unknown fault point {point!r} (one of {', '.join(POINTS)})")
    return point, int(nth or 1)


@dataclass
class FaultPoints:
    """Where this process is told to crash or freeze; `reach` is called at each point."""

    crash_at: tuple[str, int] | None = None
    stop_at: tuple[str, int] | None = None
    _reached: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> FaultPoints:
        """Raises: ValueError for an unknown point."""
        return cls(_parse(environ.get(CRASH_ENV), CRASH_ENV), _parse(environ.get(STOP_ENV), STOP_ENV))

    @property
    def armed(self) -> bool:
        return self.crash_at is not None or self.stop_at is not None

    def reach(self, point: FaultPoint) -> None:
        if not self.armed:
            return
        count = self._reached[point] = self._reached.get(point, 0) + 1
        if self.crash_at == (point, count):
            logger.warning("fault injection: crashing at %s (#%d)", point, count)
            os._exit(CRASH_EXIT_CODE)
        if self.stop_at == (point, count):
            logger.warning("fault injection: stopping at %s (#%d)", point, count)
            os.kill(os.getpid(), signal.SIGSTOP)


NO_FAULTS = FaultPoints()
