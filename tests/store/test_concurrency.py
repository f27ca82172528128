"""Many claimants, one key: exactly one call is admitted to dispatch, from threads and from processes."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy.exc import DBAPIError

from store import Admission, Store
from store import events as ev
from store.log import Append
from tests.store.builders import NOW, call_request
from tests.store.racing import at_once, in_processes
from tests.store.workers import admit_one_key

CLAIMANTS = 20


def test_concurrent_admits_of_one_key_from_threads_admit_exactly_one(store: Store) -> None:
    def claim(n: int) -> Admission:
        return store.admit(call_request(tool_call_id=f"tc-{n}", idempotency_key="shared"))

    admissions = at_once(claim, range(CLAIMANTS))

    new = [a for a in admissions if a.kind == "new"]
    assert len(new) == 1
    assert new[0].call.status == "dispatching"
    assert {a.call.tool_call_id for a in admissions} == {new[0].call.tool_call_id}
    assert [e.type for e in store.events()].count("tool_call.dispatching") == 1
    assert store.verify().ok


def test_concurrent_admits_of_many_keys_from_threads_keep_one_gapless_chain(store: Store) -> None:
    def claim(n: int) -> Admission:
        return store.admit(
            call_request(tool_call_id=f"tc-{n}", idempotency_key=f"k-{n}", run_id=f"run-{n % 3}")
        )

    admissions = at_once(claim, range(CLAIMANTS))

    assert all(a.kind == "new" for a in admissions)
    seqs = [e.seq for e in store.events()]
    assert seqs == list(range(1, CLAIMANTS * 2 + 3 + 1))
    assert store.verify().ok


@pytest.mark.postgres
def test_concurrent_admits_of_one_key_from_processes_admit_exactly_one(pg_schema_url: str) -> None:
    with Store.open(pg_schema_url) as store:
        store.migrate()
        outcomes = in_processes(admit_one_key, pg_schema_url, 5, 4)
        assert not [o for o in outcomes if o[0] == "error"], outcomes
        new = [o for o in outcomes if o[0] == "new"]
        assert len(new) == 1 and new[0][2] == "dispatching"
        assert {o[1] for o in outcomes} == {new[0][1]}
        assert [e.type for e in store.events()].count("tool_call.dispatching") == 1
        assert store.verify().ok


def test_a_writer_frozen_inside_its_transaction_holds_the_log_head_only_until_the_timeout(
    pg_schema_url: str,
) -> None:
    # What PostgreSQL sees of a replica paused (SIGSTOP, a VM pause) in the middle of a write: a session
    # idle inside a transaction that holds the head's row lock. Every other writer queues behind it.
    with Store.open(pg_schema_url) as setup:
        # Migrated with the default timeout: alembic imports each migration inside its transaction, which
        # on a loaded machine can leave the session idle for more than the 1 s this test sets.
        setup.migrate()
    with Store.open(pg_schema_url, idle_transaction_timeout_s=1) as store:
        frozen = store.engine.connect()
        transaction = frozen.begin()
        log = Append(frozen)  # takes the head lock
        log.add(
            ev.RunStartedEvent(
                occurred_at=ev.format_ts(NOW),
                producer="frozen-replica",
                run_id="run-frozen",
                tenant="acme",
                payload=ev.RunStarted(tenant="acme", subject="agent-1"),
            )
        )
        log.flush()

        admitted: list[Admission] = []
        writer = threading.Thread(
            target=lambda: admitted.append(store.admit(call_request(idempotency_key="after-the-freeze"))),
            daemon=True,
        )
        writer.start()
        writer.join(timeout=30)  # without the timeout it waits for as long as the freeze lasts
        assert [a.call.status for a in admitted] == ["dispatching"]

        # The frozen writer wakes up to find its session ended: nothing it wrote is committed.
        with pytest.raises(DBAPIError) as ended:
            transaction.commit()
        assert ended.value.connection_invalidated
        frozen.close()
        assert "run-frozen" not in {e.run_id for e in store.events()}
    # Verified with the default timeout: verify reads the log in pages inside one snapshot, and on a
    # loaded machine its replay between two pages can outlast the 1 s this case sets.
    with Store.open(pg_schema_url) as store:
        assert store.verify().ok


def test_the_idle_transaction_timeout_can_be_left_to_the_server(pg_schema_url: str) -> None:
    with Store.open(pg_schema_url, idle_transaction_timeout_s=0) as store, store.engine.connect() as conn:
        assert conn.exec_driver_sql("SHOW idle_in_transaction_session_timeout").scalar() == "0"
    with Store.open(pg_schema_url) as store, store.engine.connect() as conn:
        assert conn.exec_driver_sql("SHOW idle_in_transaction_session_timeout").scalar() == "15s"
