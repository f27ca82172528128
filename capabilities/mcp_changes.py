"""What an upstream MCP server announces between calls: its tools, resources or prompts changed
(`notifications/*/list_changed`), or a resource it was asked to watch was updated
(`notifications/resources/updated`).

The executor hands each to whoever listens (the registry, which discovers the upstream again; the
MCP face, which tells its own clients). A listener runs in a task of the upstream's session, so one
that is slow delays only the next announcement of that upstream.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Literal

import mcp_types as types

logger = logging.getLogger(__name__)

Listing = Literal["tools", "resources", "prompts"]
ListChanged = Callable[[str, Listing], Awaitable[None]]
"""Called with the backend's name and which of its listings changed."""
ResourceUpdated = Callable[[str, str], Awaitable[None]]
"""Called with the backend's name and the upstream URI of the updated resource."""

_LISTINGS: dict[type[object], Listing] = {
    types.ToolListChangedNotification: "tools",
    types.ResourceListChangedNotification: "resources",
    types.PromptListChangedNotification: "prompts",
}


class Announcements:
    """One upstream's `Client(message_handler=...)`: list changes and resource updates, passed on."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._changed: list[ListChanged] = []
        self._updated: list[ResourceUpdated] = []

    def on_list_changed(self, listener: ListChanged) -> None:
        self._changed.append(listener)

    def on_resource_updated(self, listener: ResourceUpdated) -> None:
        self._updated.append(listener)

    async def handle(self, message: types.ServerNotification | Exception) -> None:
        if isinstance(message, Exception):
            logger.debug("mcp backend %r: transport reported %r", self._name, message)
            return
        listing = _LISTINGS.get(type(message))
        if listing is not None:
            logger.info("mcp backend %r: its %s changed", self._name, listing)
            for changed in list(self._changed):
                await changed(self._name, listing)
        elif isinstance(message, types.ResourceUpdatedNotification):
            for updated in list(self._updated):
                await updated(self._name, str(message.params.uri))
