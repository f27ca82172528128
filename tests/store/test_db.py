"""SQLite stores: a new file gets 8 KiB pages, one created before keeps its own (issue 16 item 8)."""

from __future__ import annotations

import re
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest

from store import Store
from store.db import SQLITE_PAGE_SIZE, normalize_url
from store.model import StoreError
from tests.store.builders import NOW, call_request, outcome


def _pragma(path: Path, name: str) -> object:
    with sqlite3.connect(path) as db:
        return db.execute(f"PRAGMA {name}").fetchone()[0]


def test_a_new_sqlite_store_has_pages_of_8_kib_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "writ.db"
    with Store.open(f"sqlite:///{path}") as store:
        store.migrate()
    assert _pragma(path, "page_size") == SQLITE_PAGE_SIZE == 8192  # not SQLite's default of 4096
    assert _pragma(path, "journal_mode") == "wal"


def test_a_sqlite_store_made_with_4_kib_pages_keeps_them_and_records_calls(tmp_path: Path) -> None:
    path = tmp_path / "writ.db"
    with sqlite3.connect(path) as db:  # as every store before: SQLite's default page, then WAL
        db.execute("PRAGMA page_size=4096")
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("CREATE TABLE made_before (x)")
    with Store.open(f"sqlite:///{path}") as store:
        store.migrate()
        store.admit(call_request(tool_call_id="tc-1", idempotency_key="k1"))
        store.record_outcome(outcome("tc-1", "completed", result={"n": 1}, now=NOW))
        assert store.get_call("tc-1").status == "completed"  # type: ignore[union-attr]
        assert store.verify().ok
    assert _pragma(path, "page_size") == 4096


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("127.0.0.1:5432/writ", "is not a URL: use sqlite:///PATH or postgresql://"),
        ("mysql://writ@db/writ", "unsupported store URL scheme 'mysql'"),
    ],
)
def test_a_store_url_writ_cannot_use_is_a_store_error_saying_what_to_write(url: str, said: str) -> None:
    # Without a scheme, SQLAlchemy's ArgumentError reached the user as a traceback.
    with pytest.raises(StoreError, match=re.escape(said)):
        normalize_url(url)


def test_the_database_time_is_the_postgresql_servers_clock_and_none_on_sqlite(store: Store) -> None:
    """Replicas of a PostgreSQL store keep business time by its server's clock (gateway.clock); SQLite's
    processes share their host's, so it has none of its own."""
    now = store.database_time()
    if store.engine.dialect.name == "sqlite":
        assert now is None
    else:
        assert now is not None and now.tzinfo is not None
        assert abs((now - datetime.now(UTC)).total_seconds()) < 5  # the server runs on this host
