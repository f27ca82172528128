"""Upstream subscriptions held for Writ's clients (`Watched`): one per URI, renewed on a new session."""

from __future__ import annotations

from typing import Any

import mcp_types as types
import pytest

from capabilities.contract import BackendUnavailable
from capabilities.mcp_changes import Announcements, Watched

pytestmark = pytest.mark.anyio


class FakeSession:
    """The parts of an SDK `Client` that `Watched` uses, remembering what it was asked."""

    def __init__(self, *, subscribe: bool = True, protocol_version: str = "2025-11-25") -> None:
        self.protocol_version = protocol_version
        resources = types.ResourcesCapability(subscribe=subscribe)
        self.server_capabilities = types.ServerCapabilities(resources=resources)
        self.asked: list[tuple[str, str]] = []

    async def subscribe_resource(self, uri: str) -> Any:
        self.asked.append(("subscribe", uri))

    async def unsubscribe_resource(self, uri: str) -> Any:
        self.asked.append(("unsubscribe", uri))


async def test_a_uri_is_subscribed_upstream_once_and_unsubscribed_after_its_last_watcher() -> None:
    watched, session = Watched("up"), FakeSession()
    await watched.watch(session, "note://a", 5)  # type: ignore[arg-type]
    await watched.watch(session, "note://a", 5)  # type: ignore[arg-type]
    await watched.unwatch(session, "note://a", 5)  # type: ignore[arg-type]
    assert session.asked == [("subscribe", "note://a")]
    await watched.unwatch(session, "note://a", 5)  # type: ignore[arg-type]
    await watched.unwatch(session, "note://a", 5)  # type: ignore[arg-type]  # one too many: nothing
    assert session.asked == [("subscribe", "note://a"), ("unsubscribe", "note://a")]


async def test_a_new_session_is_subscribed_to_every_uri_still_watched() -> None:
    watched, first, second = Watched("up"), FakeSession(), FakeSession()
    await watched.watch(first, "note://a", 5)  # type: ignore[arg-type]
    await watched.watch(first, "note://b", 5)  # type: ignore[arg-type]
    await watched.unwatch(first, "note://b", 5)  # type: ignore[arg-type]
    await watched.renew(second, 5)  # type: ignore[arg-type]
    assert second.asked == [("subscribe", "note://a")]


@pytest.mark.parametrize(
    ("session", "said"),
    [
        (FakeSession(subscribe=False), "offers no resource subscriptions"),
        (FakeSession(protocol_version="2026-07-28"), "no listen stream to ask on"),
    ],
)
async def test_an_upstream_that_takes_no_subscription_is_refused_and_nothing_is_counted(
    session: FakeSession, said: str
) -> None:
    watched, later = Watched("up"), FakeSession()
    with pytest.raises(BackendUnavailable, match=said):
        await watched.watch(session, "note://a", 5)  # type: ignore[arg-type]
    await watched.renew(later, 5)  # type: ignore[arg-type]
    assert (session.asked, later.asked) == ([], [])


async def test_a_2026_upstream_is_asked_on_its_listen_stream_for_exactly_the_uris_watched() -> None:
    """It has no resources/subscribe: the listen stream's filter is what is watched (opened again)."""
    announcements = Announcements("up")
    watched, session = Watched("up", announcements), FakeSession(protocol_version="2026-07-28")
    await watched.watch(session, "note://b", 5)  # type: ignore[arg-type]
    await watched.watch(session, "note://a", 5)  # type: ignore[arg-type]
    await watched.watch(session, "note://a", 5)  # type: ignore[arg-type]
    assert announcements.watching == ("note://a", "note://b")
    await watched.unwatch(session, "note://a", 5)  # type: ignore[arg-type]
    assert announcements.watching == ("note://a", "note://b")  # one watcher of it is left
    await watched.unwatch(session, "note://a", 5)  # type: ignore[arg-type]
    await watched.unwatch(session, "note://b", 5)  # type: ignore[arg-type]
    assert announcements.watching == ()
    assert session.asked == []  # never resources/subscribe
