"""Writ's clients hear of what changed upstream: a listing an upstream changed (after the registry took
the new one), and updates of resources they subscribed to.

A 2025-11-25 session is told on its standing stream (`notifications/tools/list_changed`, ...; a
resource update only to a session that subscribed to that URI); a 2026-07-28 client hears them on a
`subscriptions/listen` stream it opened, which delivers only the kinds (and URIs) it asked for. Both
are per process: each replica holds its own upstream sessions and hears their announcements itself.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler
from mcp.shared.exceptions import NoBackChannelError
from mcp.shared.subscriptions import (
    PromptsListChanged,
    ResourcesListChanged,
    ResourceUpdated,
    ServerEvent,
    ToolsListChanged,
)

from capabilities.mcp_changes import Listing
from gateway.mcp.rounds import is_modern
from gateway.mcp.sdk import connection_of

logger = logging.getLogger(__name__)

_EVENTS: dict[Listing, ServerEvent] = {
    "tools": ToolsListChanged(),
    "resources": ResourcesListChanged(),
    "prompts": PromptsListChanged(),
}


class Notices:
    """Who is told of changes: the 2025-11-25 sessions seen, and the 2026-07-28 listen streams."""

    def __init__(self) -> None:
        self.bus = InMemorySubscriptionBus()
        self.listen = ListenHandler(self.bus)
        """The `subscriptions/listen` handler (2026-07-28)."""
        self._sessions: weakref.WeakSet[Any] = weakref.WeakSet()
        self.may_hear: Callable[[dict[str, Any], str], Awaitable[bool]] = _nobody
        """Whether a 2025-11-25 session (by its state) is told of an update of a URI now."""

    async def track(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        """Middleware: remember each 2025-11-25 session that makes a request."""
        connection = connection_of(ctx)
        if connection is not None and not is_modern(ctx):
            self._sessions.add(connection)
        return await call_next(ctx)

    async def listing_changed(self, listing: Listing) -> None:
        """Tell every client that `listing` changed (what each may see is filtered when it lists)."""
        await self.bus.publish(_EVENTS[listing])
        await self._to_sessions(f"notifications/{listing}/list_changed")

    async def resource_updated(self, uri: str) -> None:
        """Tell the clients watching `uri` (as Writ shows it) that it was updated."""
        await self.bus.publish(ResourceUpdated(uri=uri))
        for connection in list(self._sessions):
            if await self.may_hear(connection.state, uri):
                await self._tell(connection, "notifications/resources/updated", {"uri": uri})

    async def _to_sessions(self, method: str) -> None:
        for connection in list(self._sessions):
            await self._tell(connection, method, None)

    async def _tell(self, connection: Any, method: str, params: dict[str, Any] | None) -> None:
        try:
            await connection.outbound.notify(method, params)
        except (NoBackChannelError, anyio.ClosedResourceError, anyio.BrokenResourceError) as exc:
            logger.debug("%s not delivered to a closed session: %r", method, exc)
            self._sessions.discard(connection)


async def _nobody(state: dict[str, Any], uri: str) -> bool:
    return False
