"""Console sessions as the console opens them (`gateway.console.sessions`), on the store's fake: a fresh
random id each, kept by its digest, lasting as long as the token and never past `MAX_SESSION`, acting
as the whole principal that signed in, and gone once ended."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gateway.console.sessions import MAX_SESSION, Sessions, SignIn
from policy.model import Principal
from store.console_sessions import session_digest
from tests.fakes import FakeConsoleSessions

pytestmark = pytest.mark.anyio

NOW = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)
BOB = Principal(
    "bob",
    "acme",
    roles=frozenset({"approver", "auditor"}),
    scopes=frozenset({"writ"}),
    client_id="cli",
    groups=frozenset({"ops"}),
)


def signed_in(lasts: timedelta, who: Principal = BOB) -> SignIn:
    return SignIn(principal=who, expires_at=NOW + lasts)


async def test_a_session_acts_as_the_whole_principal_and_is_kept_only_by_its_ids_digest() -> None:
    store = FakeConsoleSessions()
    sessions = Sessions(store)

    session_id = await sessions.open(signed_in(timedelta(hours=1)), NOW)

    assert await sessions.principal(session_id, NOW) == BOB
    assert list(store.sessions) == [session_digest(session_id)]
    assert session_id not in store.sessions


async def test_each_session_gets_a_fresh_random_id_of_32_bytes() -> None:
    sessions = Sessions(FakeConsoleSessions())

    ids = {await sessions.open(signed_in(timedelta(hours=1)), NOW) for _ in range(20)}

    assert len(ids) == 20
    assert all(len(i) == 43 for i in ids)  # secrets.token_urlsafe(32)


@pytest.mark.parametrize(
    ("token_lasts", "session_lasts"),
    [
        (timedelta(minutes=15), timedelta(minutes=15)),  # the token's own expiry
        (MAX_SESSION, MAX_SESSION),
        (timedelta(days=30), MAX_SESSION),  # a long-lived token: 12 hours at most
    ],
)
async def test_a_session_lasts_as_long_as_its_token_and_at_most_twelve_hours(
    token_lasts: timedelta, session_lasts: timedelta
) -> None:
    store = FakeConsoleSessions()
    sessions = Sessions(store)

    session_id = await sessions.open(signed_in(token_lasts), NOW)

    (kept,) = store.sessions.values()
    assert (kept.created_at, kept.expires_at) == (NOW, NOW + session_lasts)
    assert await sessions.principal(session_id, NOW + session_lasts - timedelta(seconds=1)) == BOB
    assert await sessions.principal(session_id, NOW + session_lasts) is None


async def test_a_token_that_expired_within_the_verifiers_leeway_opens_no_session() -> None:
    store = FakeConsoleSessions()

    with pytest.raises(ValueError, match="must end after it begins"):
        await Sessions(store).open(signed_in(timedelta(seconds=-5)), NOW)

    assert store.sessions == {}


async def test_an_ended_or_unknown_session_acts_as_no_one() -> None:
    sessions = Sessions(FakeConsoleSessions())
    session_id = await sessions.open(signed_in(timedelta(hours=1)), NOW)

    assert await sessions.end(session_id, NOW)
    assert not await sessions.end(session_id, NOW)

    assert await sessions.principal(session_id, NOW) is None
    assert await sessions.principal("never-opened", NOW) is None
