"""Python callables the python-backend tests expose as capabilities."""

from __future__ import annotations

import threading

import anyio

from capabilities.contract import ToolResult


def add(a: int, b: int = 1) -> dict[str, int]:
    """Add two numbers."""
    return {"sum": a + b}


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
