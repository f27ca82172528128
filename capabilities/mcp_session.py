"""One persistent MCP client session to an upstream, reopened when it dies.

The session lives in an asyncio task of its own rather than in a task group entered by the caller:
a task group opened in `start()` and closed in `close()` would nest a cancel scope into whatever the
gateway does in between, and a dying transport would cancel the caller. Here a transport that dies
ends its own task only; the next call opens a fresh session.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Coroutine
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from typing import Any

import anyio
from mcp import Client

from capabilities.contract import BackendUnavailable

_CLOSE_GRACE_S = 5.0

ClientFactory = Callable[[AsyncExitStack, Callable[[], None]], AbstractAsyncContextManager[Client]]
Watcher = Callable[[Client], Coroutine[Any, Any, None]]
"""Runs beside each open session (it is cancelled when the session ends) and must not raise."""
"""Builds an un-entered client; may push cleanups (an HTTP client to close) onto the stack. The
callable is for a transport that learns its connection has ended on its own (a stdio server closed
its stdout): the session is then given up, and the next call opens a new one instead of failing."""


class Session:
    """One open client session and the task that holds it."""

    def __init__(self) -> None:
        self.client: Client | None = None
        self.alive = False
        self.error: Exception | None = None
        self.ready = anyio.Event()
        self.stop = anyio.Event()
        self.finished = anyio.Event()
        self.task: asyncio.Task[None] | None = None
        self.logging_asked = False
        """Whether this session's upstream was asked for its log messages (`logging/setLevel`)."""

    def kill(self) -> None:
        """Mark the session dead and let its task close the client."""
        self.alive = False
        self.stop.set()


class SessionKeeper:
    """Hands out the live session, opening one when there is none."""

    def __init__(
        self,
        name: str,
        factory: ClientFactory,
        *,
        open_timeout_s: float,
        describe: Callable[[BaseException], str],
        watch: Watcher | None = None,
    ) -> None:
        self._name = name
        self._watch = watch
        self._factory = factory
        self._open_timeout_s = open_timeout_s
        self._describe = describe
        self._current: Session | None = None
        self._tasks: set[Session] = set()
        """Sessions whose task has not finished (dead ones too), so close() can end them all."""
        self._lock = anyio.Lock()
        self._open = False

    async def start(self) -> Session:
        """Open the first session.

        Raises:
            BackendUnavailable: the upstream cannot be reached or does not complete the handshake.
        """
        self._open = True
        return await self.current()

    async def current(self) -> Session:
        """The live session, reopened if the last one died.

        Raises:
            BackendUnavailable: not started, or the upstream cannot be reached.
        """
        session = self._current
        if session is not None and session.alive:
            return session
        async with self._lock:
            if self._current is not None and self._current.alive:
                return self._current
            if not self._open:
                raise BackendUnavailable(f"mcp backend {self._name!r} is not started")
            self._current = await self._spawn()
            return self._current

    async def close(self) -> None:
        self._open = False
        self._current = None
        sessions = list(self._tasks)
        for session in sessions:
            session.kill()
        for session in sessions:
            await _end(session)

    async def _spawn(self) -> Session:
        session = Session()
        self._tasks.add(session)
        loop = asyncio.get_running_loop()
        # In a context of its own: a session opened during a call must not keep that call's context
        # (its relay, `mcp_midcall.current_relay`) for every message it reads afterwards.
        session.task = loop.create_task(
            self._hold(session), name=f"writ-mcp-session-{self._name}", context=contextvars.Context()
        )
        with anyio.move_on_after(self._open_timeout_s) as waiting:
            await session.ready.wait()
        if waiting.cancelled_caught:
            session.kill()
            await _end(session)
            raise BackendUnavailable(
                f"mcp backend {self._name!r}: no handshake within {self._open_timeout_s}s"
            )
        if not session.alive:
            error = session.error
            detail = self._describe(error) if error is not None else "the session ended at once"
            raise BackendUnavailable(f"mcp backend {self._name!r}: cannot connect: {detail}") from error
        return session

    async def _hold(self, session: Session) -> None:
        try:
            async with AsyncExitStack() as stack:
                client = await stack.enter_async_context(self._factory(stack, session.kill))
                session.client = client
                session.alive = True
                session.ready.set()
                async with anyio.create_task_group() as group:
                    if self._watch is not None:
                        group.start_soon(self._watch, client)
                    await session.stop.wait()
                    group.cancel_scope.cancel()
        except Exception as exc:  # top of this task: a dead transport ends the session, nothing else
            session.error = exc
        finally:
            session.alive = False
            session.ready.set()
            session.finished.set()
            self._tasks.discard(session)


async def _end(session: Session) -> None:
    """Let the session task leave its client cleanly; cancel it if that takes too long."""
    with anyio.move_on_after(_CLOSE_GRACE_S):
        await session.finished.wait()
    task = session.task
    if task is not None and not task.done():
        task.cancel()
        with anyio.move_on_after(_CLOSE_GRACE_S, shield=True):
            await asyncio.wait([task])
