"""`store.raw.Statement` answers exactly as SQLAlchemy Core's `conn.execute` does, on both databases.

`store/raw.py` reads compiled statements through private SQLAlchemy attributes (pinned to a minor
version in pyproject.toml); these tests are what an upgrade of SQLAlchemy must pass before the pin moves.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from sqlalchemy import bindparam, exc, select, update

from store import Store
from store.raw import Statement
from store.schema import runs

STARTED = datetime(2026, 11, 30, 13, 0, 0, 123456, tzinfo=timezone(timedelta(hours=1)))
INSERT = Statement(runs.insert())
BY_TENANT = Statement(select(runs).where(runs.c.tenant == bindparam("b_tenant")).order_by(runs.c.run_id))
COUNT = Statement(
    update(runs).where(runs.c.tenant == bindparam("b_tenant")).values(call_count=runs.c.call_count + 1)
)


def run_row(run_id: str, tenant: str = "acme") -> dict[str, object]:
    return {"run_id": run_id, "tenant": tenant, "subject": "alice", "started_at": STARTED, "call_count": 0}


def test_rows_read_on_the_cursor_equal_what_core_reads(store: Store) -> None:
    with store.engine.begin() as conn:
        INSERT.execute_many(conn, [run_row("run-1"), run_row("run-2"), run_row("run-3", "other")])
        raw = BY_TENANT.rows(conn, {"b_tenant": "acme"})
        core = conn.execute(BY_TENANT.statement, {"b_tenant": "acme"}).all()
    assert [tuple(row) for row in raw] == [tuple(row) for row in core]
    assert [row.run_id for row in raw] == ["run-1", "run-2"]
    assert raw[0].started_at == STARTED and raw[0].started_at.tzinfo == UTC  # through UTCDateTime


def test_an_update_reports_the_rows_it_matched(store: Store) -> None:
    with store.engine.begin() as conn:
        INSERT.execute_many(conn, [run_row("run-1"), run_row("run-2")])
        assert COUNT.execute(conn, {"b_tenant": "acme"}) == 2
        assert COUNT.execute(conn, {"b_tenant": "nobody"}) == 0
        assert [row.call_count for row in BY_TENANT.rows(conn, {"b_tenant": "acme"})] == [1, 1]


def test_one_and_one_or_none_refuse_as_core_does(store: Store) -> None:
    with store.engine.begin() as conn:
        INSERT.execute_many(conn, [run_row("run-1"), run_row("run-2")])
        assert BY_TENANT.one_or_none(conn, {"b_tenant": "nobody"}) is None
        with pytest.raises(exc.NoResultFound):
            BY_TENANT.one(conn, {"b_tenant": "nobody"})
        with pytest.raises(exc.MultipleResultsFound):
            BY_TENANT.one_or_none(conn, {"b_tenant": "acme"})


def test_a_unique_violation_is_wrapped_as_core_wraps_it(store: Store) -> None:
    with pytest.raises(exc.IntegrityError), store.engine.begin() as conn:
        INSERT.execute(conn, run_row("run-1"))
        INSERT.execute(conn, run_row("run-1"))


def test_statements_run_on_after_one_failed_on_the_same_connection(store: Store) -> None:
    with store.engine.connect() as conn:
        with pytest.raises(exc.IntegrityError), conn.begin():
            INSERT.execute(conn, run_row("run-1"))
            INSERT.execute(conn, run_row("run-1"))
        with conn.begin():
            INSERT.execute_many(conn, [run_row("run-2"), run_row("run-3")])
            assert [row.run_id for row in BY_TENANT.rows(conn, {"b_tenant": "acme"})] == ["run-2", "run-3"]


def test_statements_run_on_a_connection_made_again_after_it_was_invalidated(store: Store) -> None:
    with store.engine.connect() as conn:
        with conn.begin():
            INSERT.execute(conn, run_row("run-1"))
        conn.invalidate()
        with conn.begin():  # a new DBAPI connection: the cursor kept for the old one is not used
            assert COUNT.execute(conn, {"b_tenant": "acme"}) == 1
            assert [row.call_count for row in BY_TENANT.rows(conn, {"b_tenant": "acme"})] == [1]
