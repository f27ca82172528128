"""What an upstream MCP server announces between calls: its tools, resources or prompts changed
(`notifications/*/list_changed`), or a resource it was asked to watch was updated
(`notifications/resources/updated`).

The executor hands each to whoever listens (the registry, which discovers the upstream again; the
MCP face, which tells its own clients). A listener runs in a task of the upstream's session, so one
that is slow delays only the next announcement of that upstream.
"""

from __future__ import annotations

import logging
import warnings
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Literal

import anyio
import mcp_types as types
from mcp import Client, MCPError
from mcp.client.subscriptions import ListenNotSupportedError, SubscriptionLost
from mcp.shared.exceptions import MCPDeprecationWarning
from mcp.shared.subscriptions import PromptsListChanged, ResourcesListChanged, ServerEvent, ToolsListChanged
from mcp.shared.subscriptions import ResourceUpdated as ServerResourceUpdated
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from capabilities.contract import BackendUnavailable

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
        self._uris: tuple[str, ...] = ()
        self._refilter = anyio.Event()

    def on_list_changed(self, listener: ListChanged) -> None:
        self._changed.append(listener)

    def on_resource_updated(self, listener: ResourceUpdated) -> None:
        self._updated.append(listener)

    @property
    def watching(self) -> tuple[str, ...]:
        """The upstream URIs the listen stream asks updates of (a 2026-07-28 upstream)."""
        return self._uris

    def watch_only(self, uris: Sequence[str]) -> None:
        """The upstream URIs a 2026-07-28 upstream's listen stream asks updates of from now on: the
        stream is opened again with them (its filter is fixed when it opens; SEP-2575 has no way to
        change it), and an update in between is not heard (no replay: a watcher reads again)."""
        if tuple(sorted(uris)) != self._uris:
            self._uris = tuple(sorted(uris))
            self._refilter.set()
            self._refilter = anyio.Event()

    async def listen(self, client: Client) -> None:
        """Hear a 2026-07-28 upstream's list changes and updates of the watched resources on a
        `subscriptions/listen` stream, for as long as the session lasts (a 2025-11-25 one sends them
        unasked, to `handle`)."""
        if client.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            return
        while await self._listen_once(client):
            pass

    async def _listen_once(self, client: Client) -> bool:
        """One stream, until it ends (False) or the watched URIs change (True: open another)."""
        refilter, uris = self._refilter, self._uris
        # A version pinned in config synthesizes the upstream's capabilities (all empty), so they
        # cannot tell whether it announces anything: ask for every kind, and take what it honours.
        try:
            async with (
                client.listen(
                    tools_list_changed=True,
                    prompts_list_changed=True,
                    resources_list_changed=True,
                    resource_subscriptions=uris,
                ) as subscription,
                anyio.create_task_group() as group,
            ):
                if uris and set(subscription.honored.resource_subscriptions or ()) != set(uris):
                    logger.warning(
                        "mcp backend %r: its listen stream takes updates of %s only, of %s asked",
                        self._name,
                        list(subscription.honored.resource_subscriptions or ()),
                        list(uris),
                    )

                async def refiltered() -> None:
                    await refilter.wait()
                    group.cancel_scope.cancel()

                group.start_soon(refiltered)
                async for event in subscription:
                    await self._heard(event)
                group.cancel_scope.cancel()
        except MCPError as exc:
            level = logging.INFO if exc.code == types.METHOD_NOT_FOUND else logging.WARNING
            logger.log(level, "mcp backend %r: subscriptions/listen: %s", self._name, exc.message)
            return False
        except (ListenNotSupportedError, SubscriptionLost, TimeoutError) as exc:
            # Heard no more until the session is opened again (the next call after it died).
            logger.warning("mcp backend %r: subscriptions/listen ended: %r", self._name, exc)
            return False
        return refilter.is_set()

    async def _heard(self, event: ServerEvent) -> None:
        listing: Listing | None = None
        if isinstance(event, ToolsListChanged):
            listing = "tools"
        elif isinstance(event, PromptsListChanged):
            listing = "prompts"
        elif isinstance(event, ResourcesListChanged):
            listing = "resources"
        if listing is not None:
            await self._changed_to(listing)
        elif isinstance(event, ServerResourceUpdated):
            for updated in list(self._updated):
                await updated(self._name, event.uri)

    async def _changed_to(self, listing: Listing) -> None:
        logger.info("mcp backend %r: its %s changed", self._name, listing)
        for changed in list(self._changed):
            await changed(self._name, listing)

    async def handle(self, message: types.ServerNotification | Exception) -> None:
        if isinstance(message, Exception):
            logger.debug("mcp backend %r: transport reported %r", self._name, message)
            return
        listing = _LISTINGS.get(type(message))
        if listing is not None:
            await self._changed_to(listing)
        elif isinstance(message, types.ResourceUpdatedNotification):
            for updated in list(self._updated):
                await updated(self._name, str(message.params.uri))


class Watched:
    """The upstream resources Writ's clients watch: each subscribed upstream once, for all of them
    (2025-11-25 `resources/subscribe`), and unsubscribed when the last one stops watching."""

    def __init__(self, name: str, announcements: Announcements | None = None) -> None:
        self._name = name
        self._counts: Counter[str] = Counter()
        self._lock = anyio.Lock()
        self._announcements = announcements
        """Where a 2026-07-28 upstream is asked for updates: its listen stream's filter."""

    async def renew(self, client: Client, timeout_s: float) -> None:
        """Subscribe a new session (the last one died) to every URI still watched (failures logged)."""
        async with self._lock:
            for uri in list(self._counts):
                try:
                    await self._ask(client, uri, timeout_s, subscribe=True)
                except BackendUnavailable as exc:
                    logger.warning("%s", exc)

    async def watch(self, client: Client, uri: str, timeout_s: float) -> None:
        """Count one more watcher of the upstream `uri`, subscribing upstream for the first.

        Raises:
            BackendUnavailable: the upstream takes no subscriptions, or refused or did not answer.
        """
        async with self._lock:
            if self._counts[uri] == 0:
                await self._ask(client, uri, timeout_s, subscribe=True)
            self._counts[uri] += 1

    async def unwatch(self, client: Client, uri: str, timeout_s: float) -> None:
        """Count one watcher less, unsubscribing upstream after the last (a failure is only logged)."""
        async with self._lock:
            if self._counts[uri] == 0:
                return
            self._counts[uri] -= 1
            if self._counts[uri] > 0:
                return
            del self._counts[uri]
            try:
                await self._ask(client, uri, timeout_s, subscribe=False)
            except BackendUnavailable as exc:
                logger.warning("%s", exc)

    async def _ask(self, client: Client, uri: str, timeout_s: float, *, subscribe: bool) -> None:
        method = "resources/subscribe" if subscribe else "resources/unsubscribe"
        resources = client.server_capabilities.resources
        if client.protocol_version in MODERN_PROTOCOL_VERSIONS:
            if self._announcements is None:
                raise BackendUnavailable(f"mcp backend {self._name!r}: no listen stream to ask on")
            # Counted by the caller after this returns: the filter is what is watched then.
            watched = {u for u, n in self._counts.items() if n > 0 and (u != uri or subscribe)}
            self._announcements.watch_only(sorted(watched | ({uri} if subscribe else set())))
            return
        if resources is None or not resources.subscribe:
            raise BackendUnavailable(f"mcp backend {self._name!r} offers no resource subscriptions")
        try:
            with anyio.fail_after(timeout_s), warnings.catch_warnings():
                warnings.simplefilter("ignore", MCPDeprecationWarning)  # removed at 2026-07-28
                if subscribe:
                    await client.subscribe_resource(uri)
                else:
                    await client.unsubscribe_resource(uri)
        except (MCPError, TimeoutError, ValidationError, RuntimeError) as exc:
            raise BackendUnavailable(f"mcp backend {self._name!r}: {method} {uri} failed: {exc}") from exc
