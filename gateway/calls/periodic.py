"""The one loop every background worker runs: a pass, then a wait, until cancelled.

A failed pass is logged and the next one tries again, so one bad row or a store outage never stops a
worker for good. A worker that others can hurry (the approval worker after a local decision) gives a
`Wake`, which ends the wait early.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import anyio

logger = logging.getLogger(__name__)


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
) -> None:
    """Run `tick` at start and then every `interval_s` (or on `wake`) until cancelled.

    `failure` is the message logged, with the traceback, when a pass raises.
    """
    while True:
        woken = wake.arm() if wake is not None else None
        try:
            await tick()
        except Exception:  # the top of a background task: log, keep the worker alive
            log.exception(failure)
        if woken is None:
            await anyio.sleep(interval_s)
        else:
            with anyio.move_on_after(interval_s):
                await woken.wait()
