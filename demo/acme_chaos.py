"""Fault injection for acme-payments: the in-memory chaos state and the connection dropper.

The faults are the ones a gateway must survive without paying twice: an answer that never arrives
although the refund committed (`drop_responses`, `delay_ms`), an error although the refund committed
(`fail_after_commit`), a request that never executes (`hang`), and one that executes only after the
client stopped waiting (`commit_delay_ms`: an overloaded backend, a queue in front of it; `freeze`:
the whole process stops, as in a GC pause or a VM stall, until someone sends it SIGCONT). Those two
still honour the commit deadline the client sent; `ignore_deadline` makes a refund commit past it, a
backend that breaks the commit horizon its operator declared.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

Counter = Literal["drop_responses", "fail_after_commit", "hang", "freeze", "ignore_deadline"]

# The key under which ConnectionDropper puts its `drop` coroutine function into the ASGI scope.
DROP_SCOPE_KEY = "acme.drop_connection"


@dataclass
class ChaosState:
    """Faults for the next refunds. Counters are used up one per refund that passed validation."""

    drop_responses: int = 0
    delay_ms: int = 0
    commit_delay_ms: int = 0
    """Every refund waits this long before it commits, and commits even if the client has gone (GET
    /_chaos/held lists the keys of refunds read and not yet run)."""
    fail_after_commit: int = 0
    hang: int = 0
    freeze: int = 0
    """The next N refunds stop the whole process (SIGSTOP to itself) once read and before they run;
    it stays frozen, answering nothing, until it gets SIGCONT. Test use only."""
    ignore_deadline: int = 0
    """The next N refunds commit even after their commit deadline (`Writ-Commit-Deadline`): a backend
    that lies about the horizon, so that a late commit can contradict a verdict of failure."""

    @classmethod
    def parse(cls, body: object) -> ChaosState:
        """Build a state from a JSON body; missing fields are 0.

        Raises: ValueError naming the offending field.
        """
        if not isinstance(body, dict):
            raise ValueError("the chaos body must be a JSON object")
        known = {field.name for field in fields(cls)}
        unknown = sorted(set(body) - known)
        if unknown:
            raise ValueError(f"unknown chaos fields: {', '.join(unknown)}")
        for name, value in body.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer")
        return cls(**body)

    def take(self, counter: Counter) -> bool:
        """Use up one unit of `counter`; False when it is already 0."""
        remaining = getattr(self, counter)
        if remaining <= 0:
            return False
        setattr(self, counter, remaining - 1)
        return True

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class ConnectionDropper:
    """Outermost ASGI wrapper that lets an endpoint lose its own response on purpose.

    It sits outside Starlette so that it sees the server's own `send`. Under uvicorn (h11 and
    httptools alike) that is a bound method of the connection's RequestResponseCycle, whose
    `transport` is the TCP transport: aborting it closes the socket without a byte of HTTP response.
    Under a server without that attribute the fallback starts a response and never finishes it, which
    the client also sees as a broken connection (the server logs an incomplete response).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        transport = _server_transport(send)
        dropped = False

        async def drop() -> None:
            nonlocal dropped
            dropped = True
            if transport is None:
                return
            transport.abort()
            # Let the server notice the lost connection, so it discards the app's response quietly
            # instead of reporting a response that was never sent.
            with anyio.move_on_after(1.0):
                while (await receive())["type"] != "http.disconnect":
                    pass

        async def guarded_send(message: Message) -> None:
            if not dropped:
                await send(message)
            elif transport is None and message["type"] == "http.response.start":
                await send({**message, "headers": [(b"content-length", b"1")]})

        await self.app({**scope, DROP_SCOPE_KEY: drop}, receive, guarded_send)


def _server_transport(send: Send) -> asyncio.WriteTransport | None:
    cycle: Any = getattr(send, "__self__", None)
    transport = getattr(cycle, "transport", None)
    return transport if isinstance(transport, asyncio.WriteTransport) else None
