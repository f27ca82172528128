"""Counting what code under test hands to a worker thread: a pass that should stay on the event loop."""

from __future__ import annotations

from typing import Any

import anyio.to_thread
import pytest


def hand_offs(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every function handed to `anyio.to_thread.run_sync` from now on, in order (still run)."""
    handed: list[object] = []
    real = anyio.to_thread.run_sync

    async def counted(*args: Any, **kwargs: Any) -> Any:
        handed.append(args[0])
        return await real(*args, **kwargs)

    monkeypatch.setattr(anyio.to_thread, "run_sync", counted)
    return handed
