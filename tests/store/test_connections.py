"""PostgreSQL connections in the store's pool: checked after a while unused, not before every use."""

from __future__ import annotations

import psycopg
import pytest

from store import Store, Unavailable
from tests.store.builders import call_request

pytestmark = pytest.mark.postgres


def _pooled_backend_pid(store: Store) -> int:
    with store.engine.connect() as conn:
        pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        conn.rollback()
    return int(pid)


def _end_session(postgres_url: str, pid: int) -> None:
    """What a database restart or a proxy's idle timeout does to a pooled connection."""
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        ended = admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()
    assert ended == (True,)


def test_a_connection_ended_while_it_sat_in_the_pool_is_replaced_before_it_is_used(
    pg_schema_url: str, postgres_url: str
) -> None:
    with Store.open(pg_schema_url, ping_after_idle_s=0) as store:
        store.migrate()
        _end_session(postgres_url, _pooled_backend_pid(store))

        admission = store.admit(call_request(tool_call_id="tc-1"))

        assert admission.owns_dispatch
        assert [e.type for e in store.events(tool_call_id="tc-1")][-1] == "tool_call.dispatching"


def test_a_connection_used_a_moment_ago_is_not_pinged_and_a_dead_one_costs_one_unavailable(
    pg_schema_url: str, postgres_url: str
) -> None:
    # Not pinging every checkout saves a round trip per transaction; the price, when a connection
    # dies between two uses a moment apart, is one write refused as Unavailable with nothing recorded.
    with Store.open(pg_schema_url, ping_after_idle_s=3600) as store:
        store.migrate()
        _end_session(postgres_url, _pooled_backend_pid(store))

        with pytest.raises(Unavailable):
            store.admit(call_request(tool_call_id="tc-1"))
        assert store.get_call("tc-1") is None  # the lost connection also dropped the rest of the pool

        admission = store.admit(call_request(tool_call_id="tc-2"))
        assert admission.owns_dispatch


def test_the_pool_keeps_at_most_the_configured_connections_and_overflow(pg_schema_url: str) -> None:
    with Store.open(pg_schema_url, pool_size=1, max_overflow=1) as store:
        store.migrate()
        pool = store.engine.pool
        assert (pool.size(), pool._max_overflow) == (1, 1)
