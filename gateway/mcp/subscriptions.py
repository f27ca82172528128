"""Subscriptions to updates of relayed resources: `resources/subscribe` and `resources/unsubscribe`
(2025-11-25), and the URIs a `subscriptions/listen` stream asks for (2026-07-28).

A subscription is decided as a read of the URI would be, now: only where policy allows that read
outright (not where it needs approval) and for a principal in good standing; an update is passed on
to a 2025-11-25 session only if that still holds when it comes. A 2026-07-28 stream is told of the
URIs it may watch (the acknowledged filter leaves the others out). Writ subscribes upstream once per
URI, however many clients watch it. An update says only that the resource changed (a client reads it
again, and that read is decided and recorded like any other), so subscriptions are not recorded.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import anyio
import mcp_types as types
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS

from capabilities.contract import BackendUnavailable
from capabilities.mcp_relays import shown_uri
from capabilities.registry import Registry
from gateway.auth.standing import is_revoked
from gateway.calls.catalogue import Catalogue
from gateway.clock import Clock
from gateway.mcp.changes import Notices
from gateway.mcp.relays import REFUSED, RESOURCE_NOT_FOUND, check_uri
from gateway.mcp.sdk import connection_of
from policy.model import Principal
from store.ports import CallStatus

logger = logging.getLogger(__name__)

_WATCHED = "writ/watchedResources"
NOT_WATCHED = "Not subscribed: the upstream cannot relay updates of {uri}: {why}"


class Subscriptions:
    """The subscription handlers, and the relay of upstreams' updates to the clients watching."""

    def __init__(
        self,
        registry: Registry,
        catalogue: Catalogue,
        store: CallStatus,
        caller: Callable[[], Principal],
        clock: Clock,
        notices: Notices,
    ) -> None:
        self._registry = registry
        self._catalogue = catalogue
        self._store = store
        self._caller = caller
        self._clock = clock
        self._notices = notices
        for relay in registry.upstreams():
            relay.announcements.on_resource_updated(self._updated)
        notices.may_hear = self._may_hear

    async def subscribe(self, ctx: Any, params: types.SubscribeRequestParams) -> types.EmptyResult:
        """resources/subscribe: updates of a URI this caller may read now.

        Raises:
            MCPError: no upstream serves it, policy would not let the caller read it outright, or the
                upstream cannot relay its updates.
        """
        who, uri = self._caller(), str(params.uri)
        await self._check(who, uri)
        watched = self._watched(ctx)
        if uri not in watched:
            await self._watch(uri, watching=True)
            watched[uri] = who
        return types.EmptyResult()

    async def unsubscribe(self, ctx: Any, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        """resources/unsubscribe: no more updates of the URI for this session (if it had them)."""
        uri = str(params.uri)
        watched = self._watched(ctx)
        if watched.pop(uri, None) is not None:
            try:
                await self._watch(uri, watching=False)
            except MCPError as exc:
                logger.warning("resources/unsubscribe %s: %s", uri, exc.message)
        return types.EmptyResult()

    async def listen(
        self, ctx: Any, params: types.SubscriptionsListenRequestParams
    ) -> types.SubscriptionsListenResult:
        """subscriptions/listen: the stream, with only the URIs this caller may watch (its ack says
        which); the upstream subscriptions it needs are held while it lasts."""
        who = self._caller()
        asked = list(params.notifications.resource_subscriptions or [])
        kept: list[str] = []
        for uri in asked:
            try:
                await self._check(who, uri)
                await self._watch(uri, watching=True)
            except MCPError as exc:
                logger.info("subscriptions/listen: %s left out: %s", uri, exc.message)
                continue
            kept.append(uri)
        notifications = params.notifications.model_copy(update={"resource_subscriptions": kept or None})
        try:
            return await self._notices.listen(ctx, params.model_copy(update={"notifications": notifications}))
        finally:
            with anyio.CancelScope(shield=True):
                for uri in kept:
                    try:
                        await self._watch(uri, watching=False)
                    except MCPError as exc:
                        logger.warning("subscriptions/listen: %s: %s", uri, exc.message)

    async def _check(self, who: Principal, uri: str) -> None:
        check_uri(self._registry, uri)  # policy decides on what the upstream would watch
        capability = self._registry.resource_capability(uri)
        if capability is None:
            raise MCPError(RESOURCE_NOT_FOUND, f"Resource not found: {uri}", {"uri": uri})
        if await is_revoked(self._store, who):
            raise MCPError(REFUSED, "Refused: the principal is revoked", {"status": "denied"})
        decision = self._catalogue.read_decision(who, capability, uri, self._clock())
        if decision.effect != "allow":
            data = {"status": "denied", "reason": decision.reason, "uri": uri}
            raise MCPError(
                REFUSED, f"Not subscribed ({decision.reason}): a read of {uri} is not allowed", data
            )

    async def _watch(self, uri: str, *, watching: bool) -> None:
        capability = self._registry.resource_capability(uri)
        relay = self._registry.relay(capability) if capability is not None else None
        if relay is None:
            raise MCPError(RESOURCE_NOT_FOUND, f"Resource not found: {uri}", {"uri": uri})
        try:
            await relay.watch(uri, watching=watching)
        except BackendUnavailable as exc:
            raise MCPError(INVALID_PARAMS, NOT_WATCHED.format(uri=uri, why=exc)) from exc

    def _watched(self, ctx: Any) -> dict[str, Principal]:
        state = getattr(connection_of(ctx), "state", None)
        if not isinstance(state, dict):
            return {}
        watched: dict[str, Principal] = state.setdefault(_WATCHED, {})
        return watched

    async def _updated(self, backend: str, upstream: str) -> None:
        for capability, relay in self._registry.resource_relays():
            if capability.backend == backend:
                await self._notices.resource_updated(shown_uri(relay.uri_prefix or "", upstream))

    async def _may_hear(self, state: dict[str, Any], uri: str) -> bool:
        """Whether the 2025-11-25 session with this state is told of an update of `uri` now."""
        who = state.get(_WATCHED, {}).get(uri)
        if who is None:
            return False
        try:
            await self._check(who, uri)
        except MCPError as exc:
            logger.info("update of %s not passed on: %s", uri, exc.message)
            return False
        return True
