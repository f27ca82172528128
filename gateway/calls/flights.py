"""Identical reads in flight in this process, joined in memory: one backend call, every caller hears it.

A read allowed outright is recorded once, after its backend answered (`CallPipeline._read`), so no
record names it while it runs and the store cannot join a second identical read to it. This does,
for the callers of one process; replicas each run their own (a read has no effect to duplicate).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

import anyio

_T = TypeVar("_T")


class _Flight(Generic[_T]):
    def __init__(self) -> None:
        # Made by the first caller to join: most flights are joined by no one, and an event costs a
        # look-up of the running async backend (all on one event loop: no race between the two).
        self.done: anyio.Event | None = None
        self.value: list[_T] = []
        self.error: BaseException | None = None


class Flights(Generic[_T]):
    """The work running per key; a second caller with the same key waits for the first's answer."""

    def __init__(self) -> None:
        self._running: dict[Hashable, _Flight[_T]] = {}

    def __len__(self) -> int:
        return len(self._running)

    async def run(self, key: Hashable, work: Callable[[], Awaitable[_T]]) -> tuple[_T, bool]:
        """`work()`'s answer, and whether it was joined (another caller's `work` gave it).

        The first caller's `work` is shielded from its cancellation: others may be waiting for it.
        Its exception reaches every caller joined to it.
        """
        joined = self._running.get(key)
        if joined is not None:
            if joined.done is None:
                joined.done = anyio.Event()
            await joined.done.wait()
            if joined.error is not None:
                raise joined.error
            return joined.value[0], True
        flight: _Flight[_T] = _Flight()
        self._running[key] = flight
        try:
            with anyio.CancelScope(shield=True):
                value = await work()
            flight.value.append(value)
        except BaseException as exc:
            flight.error = exc
            raise
        finally:
            del self._running[key]
            if flight.done is not None:
                flight.done.set()
        return value, False
