"""Python callables the python-backend tests expose as capabilities."""

from __future__ import annotations

import sys
import threading
from datetime import UTC, datetime
from decimal import Decimal
from uuid import UUID

import anyio

from capabilities.contract import ToolResult


def add(a: int, b: int = 1) -> dict[str, int]:
    """Add two numbers."""
    return {"sum": a + b}


def word_count(text: str) -> int:
    """Count the words of a text,
    split on white space.

    A second paragraph, for people reading the code: not the tool's description.
    """
    return len(text.split())


async def greet(name: str) -> str:
    await anyio.sleep(0)
    return f"hello {name}"


def thread_name() -> str:
    return threading.current_thread().name


def numbers(n: int) -> list[int]:
    return list(range(n))


def rich() -> ToolResult:
    return ToolResult(content=({"type": "text", "text": "as is"},), structured={"kept": True})


def explode(reason: str) -> None:
    raise ValueError(f"cannot do that: {reason}")


NOT_CALLABLE = 42


RELEASE = threading.Event()
"""Set by the tests to let `block` return; it gives up by itself after a few seconds in any case."""


def block(seconds: float = 3.0) -> str:
    """A synchronous tool that hangs (a stuck socket, a lock that is never released)."""
    RELEASE.wait(seconds)
    return "woke up"


HELD: list[str] = []
"""The threads `hold` ran on, one entry per call that started."""


def hold(seconds: float = 10.0) -> str:
    """Like `block`, recording that it started: a call that never gets a thread never appears."""
    HELD.append(threading.current_thread().name)
    RELEASE.wait(seconds)
    return "released"


async def stall() -> str:
    """An async tool that never returns."""
    await anyio.sleep_forever()
    return "unreachable"


def ledger_entry() -> dict[str, object]:
    """Values JSON cannot hold, as Python code returns them every day."""
    return {
        "at": datetime(2026, 11, 30, 12, 0, tzinfo=UTC),
        "amount": Decimal("12.50"),
        "id": UUID("12345678-1234-5678-1234-567812345678"),
        "ratio": float("nan"),
        "tags": {"b", "a"},
        "pair": (1, 2),
        3: "an int key",
    }


def unstorable() -> dict[str, object]:
    """Strings with no UTF-8 form and nesting too deep to print, as a buggy callable returns them."""
    deep: dict[str, object] = {}
    for _ in range(5000):
        deep = {"a": deep}
    return {"name": "\ud800", "\udcff": 1, "deep": deep}


def exits(how: str = "exit") -> None:
    """A callable that ends the process the way scripts do, or thinks it was interrupted."""
    if how == "exit":
        sys.exit(3)
    raise KeyboardInterrupt


async def exits_async() -> None:
    raise SystemExit(4)
