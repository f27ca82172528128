"""Bounded polling: wait for something another process or task will make true, never for a time.

`await eventually(probe, until)` calls `probe` (sync or async) until `until` holds of what it returned
and returns that; `eventually_sync` is the same for synchronous tests. Both back off from 20 ms to
a quarter of a second between probes, and fail after `within_s` with the last value seen, so a test that
waits too long says what it saw instead of hanging (pytest-timeout is the last resort).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

T = TypeVar("T")

FIRST_S = 0.02
MAX_S = 0.25
WITHIN_S = 20.0


def _held(value: Any) -> bool:
    return bool(value)


async def eventually(
    probe: Callable[[], Awaitable[T]] | Callable[[], T],
    until: Callable[[T], bool] = _held,
    *,
    within_s: float = WITHIN_S,
) -> T:
    """What `probe` returned once `until` held of it (by default: once it was truthy).

    Raises:
        TimeoutError: `until` did not hold within `within_s`; the message shows the last value.
    """
    last: Any = "(no probe finished)"
    delay = FIRST_S
    try:
        with anyio.fail_after(within_s):
            while True:
                value = probe()
                if inspect.isawaitable(value):
                    value = await value
                last = value
                if until(value):  # type: ignore[arg-type]
                    return value  # type: ignore[return-value]
                await anyio.sleep(delay)
                delay = min(delay * 2, MAX_S)
    except TimeoutError as exc:
        raise TimeoutError(f"not so within {within_s} s; last seen: {last!r}") from exc


def eventually_sync(
    probe: Callable[[], T], until: Callable[[T], bool] = _held, *, within_s: float = WITHIN_S
) -> T:
    """`eventually` for synchronous tests: what `probe` returned once `until` held of it.

    Raises:
        TimeoutError: `until` did not hold within `within_s`; the message shows the last value.
    """
    deadline = time.monotonic() + within_s
    delay = FIRST_S
    while True:
        value = probe()
        if until(value):
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"not so within {within_s} s; last seen: {value!r}")
        time.sleep(delay)
        delay = min(delay * 2, MAX_S)
