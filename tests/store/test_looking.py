"""A read's look before it runs, from an event loop: the same answer as in a worker thread, seeing what
other processes committed, and on SQLite without the hand-off (store.looking)."""

from __future__ import annotations

from typing import Any

import anyio.to_thread
import pytest

from store import Store
from store.commands import RevokePrincipal
from tests.store.builders import NOW
from tests.store.test_read_records import read_request

pytestmark = pytest.mark.anyio


async def test_the_look_from_the_loop_answers_as_the_look_in_a_thread_and_sees_another_process_revoke(
    store: Store, migrated_url: str
) -> None:
    request = read_request()
    assert await store.admissible_read_async(request) is store.admissible_read(request) is True

    # Another process (its own engine) revokes: the connection the loop keeps must not hold an old view.
    with Store.open(migrated_url) as other:
        other.revoke_principal(RevokePrincipal("acme", "alice", revoked_by="root", now=NOW))

    assert await store.admissible_read_async(request) is store.admissible_read(request) is False


async def test_on_sqlite_the_look_stays_on_the_loop_and_on_postgresql_goes_to_a_thread(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    handed: list[object] = []
    real = anyio.to_thread.run_sync

    async def counted(*args: Any, **kwargs: Any) -> Any:
        handed.append(args[0])
        return await real(*args, **kwargs)

    monkeypatch.setattr(anyio.to_thread, "run_sync", counted)
    assert await store.admissible_read_async(read_request())
    # PostgreSQL is a round trip away: blocking the loop for it would stall every other call.
    assert len(handed) == (0 if store.engine.dialect.name == "sqlite" else 1)


async def test_a_store_whose_faces_record_as_others_shares_one_connection_per_looking_thread(
    store: Store,
) -> None:
    face = store.with_producer("writ-console")
    await store.admissible_read_async(read_request())
    checked_out = store.engine.pool.checkedout()  # type: ignore[attr-defined]
    await face.admissible_read_async(read_request(2))
    assert store.engine.pool.checkedout() == checked_out  # type: ignore[attr-defined]
