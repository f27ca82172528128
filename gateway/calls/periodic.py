"""The one loop every background worker runs: a pass, then a wait, until cancelled.

A failed pass is logged and the next one tries again, so one bad row or a store outage never stops a
worker for good. A failure is logged whole (with its traceback) when it starts; the same failure again
is one line, at most once a minute, and the first pass that works again says how many failed. A
database outage of a few seconds filled a log with thousands of lines: every worker, every second, a
traceback of two hundred. A worker that others can hurry (the approval worker after a local decision)
gives a `Wake`, which ends the wait early.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

import anyio

logger = logging.getLogger(__name__)

REPEAT_EVERY_S = 60.0
"""How often a failure that keeps recurring is said again, in one line."""


class Wake:
    """Ends the current wait of a periodic worker, so its next pass runs now."""

    def __init__(self) -> None:
        self._event: anyio.Event | None = None

    def __call__(self) -> None:
        if self._event is not None:
            self._event.set()

    def arm(self) -> anyio.Event:
        """A fresh event for the pass about to run: a wake during the pass hurries the next one."""
        self._event = anyio.Event()
        return self._event


async def run_periodically(
    tick: Callable[[], Awaitable[object]],
    *,
    interval_s: float,
    failure: str,
    wake: Wake | None = None,
    log: logging.Logger = logger,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Run `tick` at start and then every `interval_s` (or on `wake`) until cancelled.

    `failure` is the message logged, with the traceback, when a pass raises (see the module's doc for
    a failure that recurs).
    """
    failed = 0
    said: tuple[str, float] | None = None  # the failure last said, and when
    while True:
        woken = wake.arm() if wake is not None else None
        try:
            await tick()
        except Exception as exc:  # the top of a background task: log, keep the worker alive
            failed += 1
            now, kind = clock(), f"{type(exc).__name__}: {exc}"
            if said is None or said[0] != kind:
                log.exception(failure)
                said = (kind, now)
            elif now - said[1] >= REPEAT_EVERY_S:
                log.error("%s again (%d passes failed so far): %s", failure, failed, kind)
                said = (kind, now)
        else:
            if failed:
                log.warning("%s: passes run again, after %d failed", failure, failed)
            failed, said = 0, None
        if woken is None:
            await anyio.sleep(interval_s)
        else:
            with anyio.move_on_after(interval_s):
                await woken.wait()
