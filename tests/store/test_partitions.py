"""Partitions of the log: a chain, a head and a seq per tenant (and bucket); verify checks each chain
and names the partition of the first bad seq; writers to different partitions do not wait on one head."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from alembic import command
from sqlalchemy import Connection, delete, select, update
from sqlalchemy.exc import OperationalError

from store import Store, recording
from store import events as ev
from store.commands import RevokePrincipal
from store.log import Append, PartitionOrder, lock_head
from store.model import StoreError
from store.partitions import Partitioning, configure
from store.schema import events, log_head
from store.security import SecurityNote
from tests.store.builders import NOW, call_request, outcome

BY_TENANT = Partitioning("tenant")


@pytest.fixture
def tenants(store: Store) -> Store:
    """A log partitioned by tenant holding two calls of acme, one of globex and a security note."""
    configure(store.engine, BY_TENANT)
    store.admit(call_request(tool_call_id="tc-a1", idempotency_key="a1"))
    store.admit(call_request(tool_call_id="tc-g1", idempotency_key="g1", tenant="globex", run_id="run-g"))
    store.record_outcome(outcome("tc-a1", "completed", result={"ok": True}, now=NOW))
    store.record_security([_note()])
    store.admit(call_request(tool_call_id="tc-a2", idempotency_key="a2"))
    return store


def _note() -> SecurityNote:
    return SecurityNote(
        type="security.auth_failed", kind="expired", count=1, first_at=NOW, last_at=NOW, window_s=60.0
    )


def _rows(store: Store) -> list[dict[str, Any]]:
    with store.engine.begin() as conn:
        return [dict(r._mapping) for r in conn.execute(select(events).order_by(events.c.seq))]


def _heads(store: Store) -> dict[str, tuple[int, str]]:
    with store.engine.begin() as conn:
        return {r.partition: (r.last_seq, r.last_hash) for r in conn.execute(select(log_head))}


def test_each_tenant_and_the_tenantless_events_get_a_chain_of_their_own(tenants: Store) -> None:
    rows = _rows(tenants)
    chains: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        chains.setdefault(row["partition"], []).append(row)

    assert set(chains) == {"", "t:acme", "t:globex"}
    assert {r["tenant"] for r in chains["t:acme"]} == {"acme"}
    assert [r["type"] for r in chains[""]] == ["security.auth_failed"]
    for partition, chain in chains.items():
        assert [r["pseq"] for r in chain] == list(range(1, len(chain) + 1))
        assert [r["prev_hash"] for r in chain] == [ev.GENESIS_HASH] + [r["hash"] for r in chain[:-1]]
        assert _heads(tenants)[partition] == (len(chain), chain[-1]["hash"])
    assert len({r["seq"] for r in rows}) == len(rows)  # one global order, for readers and cursors
    report = tenants.verify()
    assert report.ok, report
    assert report.events_checked == len(rows)


def test_a_partitioned_log_replays_to_the_same_projections(tenants: Store) -> None:
    report = tenants.verify()
    assert report.projections_compared and report.projection_difference is None
    assert tenants.rebuild() == len(_rows(tenants))
    assert tenants.verify().ok


def test_buckets_split_a_tenant_by_run_and_keep_a_run_in_one(store: Store) -> None:
    configure(store.engine, Partitioning("tenant", buckets=4))
    for n in range(12):
        store.admit(call_request(tool_call_id=f"tc-{n}", idempotency_key=f"k-{n}", run_id=f"run-{n}"))
    rows = _rows(store)
    by_run: dict[str, set[str]] = {}
    for row in rows:
        by_run.setdefault(row["run_id"], set()).add(row["partition"])

    assert all(len(partitions) == 1 for partitions in by_run.values())
    assert len({p for partitions in by_run.values() for p in partitions}) > 1
    assert all(p.startswith("t:acme/") for partitions in by_run.values() for p in partitions)
    assert store.verify().ok


def _edit_partition(store: Store, partition: str, pseq: int, **values: Any) -> None:
    with store.engine.begin() as conn:
        conn.execute(
            update(events).where(events.c.partition == partition, events.c.pseq == pseq).values(values)
        )


def test_an_edited_event_is_named_by_its_partition_and_its_seq_there(tenants: Store) -> None:
    _edit_partition(tenants, "t:globex", 2, payload='{"tampered":true}')

    report = tenants.verify()
    assert (report.chain_ok, report.partition, report.first_bad_seq, report.problem) == (
        False,
        "t:globex",
        2,
        "edited",
    )
    assert "partition 't:globex'" in (report.detail or "")


def test_a_deleted_event_of_one_partition_is_found_there(tenants: Store) -> None:
    with tenants.engine.begin() as conn:
        conn.execute(delete(events).where(events.c.partition == "t:acme", events.c.pseq == 3))

    report = tenants.verify()
    assert (report.partition, report.first_bad_seq, report.problem) == ("t:acme", 3, "deleted")


def test_a_whole_partition_deleted_under_its_head_is_truncation(tenants: Store) -> None:
    with tenants.engine.begin() as conn:
        conn.execute(delete(events).where(events.c.partition == "t:globex"))

    report = tenants.verify()
    assert (report.partition, report.first_bad_seq, report.problem) == ("t:globex", 1, "truncated")


def test_a_partition_whose_head_was_deleted_or_rewritten_is_reported(tenants: Store) -> None:
    with tenants.engine.begin() as conn:
        conn.execute(update(log_head).where(log_head.c.partition == "t:acme").values(last_hash="0" * 64))
    report = tenants.verify()
    assert (report.partition, report.problem) == ("t:acme", "edited")

    with tenants.engine.begin() as conn:
        conn.execute(delete(log_head).where(log_head.c.partition == "t:globex"))
    report = tenants.verify()
    assert (report.partition, report.problem) == ("t:acme", "edited")  # the first chain in order
    acme_hash = _rows_hash(tenants)
    with tenants.engine.begin() as conn:
        conn.execute(update(log_head).where(log_head.c.partition == "t:acme").values(last_hash=acme_hash))
    report = tenants.verify()
    assert (report.partition, report.problem) == ("t:globex", "head_missing")


def _rows_hash(store: Store) -> str:
    last: str = [r for r in _rows(store) if r["partition"] == "t:acme"][-1]["hash"]
    return last


def test_an_event_moved_to_another_partition_breaks_both_chains(tenants: Store) -> None:
    with tenants.engine.begin() as conn:
        conn.execute(
            update(events)
            .where(events.c.partition == "t:globex", events.c.pseq == 2)
            .values(partition="t:acme", pseq=99)
        )

    report = tenants.verify()
    assert not report.chain_ok
    assert report.partition in {"t:acme", "t:globex"}


def test_a_log_once_partitioned_refuses_to_go_back_to_one_chain(tenants: Store) -> None:
    url = tenants.engine.url.render_as_string(hide_password=False)
    with Store.open(url) as single, pytest.raises(StoreError, match="several partitions"):
        single.admit(call_request(tool_call_id="tc-late", idempotency_key="late"))


def test_an_unpartitioned_log_upgraded_from_before_partitions_still_verifies(own_store: Store) -> None:
    store = own_store  # downgrading changes the schema: never the suite's shared one
    store.admit(call_request(tool_call_id="tc-1", idempotency_key="k1"))
    store.record_outcome(outcome("tc-1", "completed", result={"ok": True}, now=NOW))
    store.record_security([_note()])
    before = _rows(store)
    config = store._alembic_config()
    with store.engine.begin() as conn:  # the schema and the rows an older Writ left
        config.attributes["connection"] = conn
        command.downgrade(config, "0011_runs")
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT id, last_seq FROM log_head").all() == [(1, len(before))]
    with store.engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "head")

    assert [{k: v for k, v in r.items()} for r in _rows(store)] == before
    report = store.verify()
    assert report.ok, report
    configure(store.engine, BY_TENANT)  # then partitioned: the old chain goes on as partition ""
    store.admit(call_request(tool_call_id="tc-2", idempotency_key="k2"))
    store.record_security([_note()])
    rows = _rows(store)
    assert [r["partition"] for r in rows[len(before) :]] == ["t:acme"] * 2 + [""]
    assert rows[-1]["pseq"] == len(before) + 1 and rows[-1]["seq"] > before[-1]["seq"]
    assert store.verify().ok


# -- PostgreSQL: heads are row locks, and only a partition's own writers queue on its head ---------


@pytest.fixture
def pg_tenants(pg_schema_url: str) -> Iterator[Store]:
    with Store.open(pg_schema_url, partitioning=BY_TENANT) as store:
        store.migrate()
        yield store


def _run_started(tenant: str, run_id: str) -> ev.Event:
    return ev.RunStartedEvent(
        occurred_at=ev.format_ts(NOW),
        producer="test",
        run_id=run_id,
        tenant=tenant,
        payload=ev.RunStarted(tenant=tenant, subject="agent-1"),
    )


def _append(conn: Connection, tenant: str, run_id: str, *, take_head: bool = True) -> None:
    if take_head:  # as a write does: its head first, then what it reads
        lock_head(conn, f"t:{tenant}")
    log = Append(conn)
    log.add(_run_started(tenant, run_id))
    log.flush()


@pytest.mark.postgres
def test_a_writer_holding_one_tenants_head_does_not_stop_another_tenants_commit(pg_tenants: Store) -> None:
    store = pg_tenants
    holder = store.engine.connect()
    held = holder.begin()
    _append(holder, "acme", "run-held")  # t:acme's head is locked until `held` ends

    other_done = threading.Event()

    def other_tenant() -> None:
        store.admit(call_request(tool_call_id="tc-g", idempotency_key="g", tenant="globex", run_id="run-g"))
        other_done.set()

    writer = threading.Thread(target=other_tenant, daemon=True)
    writer.start()
    assert other_done.wait(timeout=20), "globex's write waited on acme's head"

    queued = pytest.raises(OperationalError, match="lock timeout")
    with store.engine.connect() as same, queued, same.begin():  # acme's own writers do queue on it
        same.exec_driver_sql("SET LOCAL lock_timeout = '300ms'")
        _append(same, "acme", "run-queued")
    held.commit()
    holder.close()
    writer.join(timeout=20)
    assert store.verify().ok


@pytest.mark.postgres
def test_a_transaction_needing_a_lower_head_starts_again_taking_both_in_order(pg_tenants: Store) -> None:
    store = pg_tenants
    with store.engine.begin() as conn:  # what a transaction is told when it would lock out of order
        lock_head(conn, "t:zeta")
        with pytest.raises(PartitionOrder) as told:
            lock_head(conn, "t:acme")
    assert told.value.partitions == {"t:acme", "t:zeta"}

    runs = iter(range(100))

    def zeta_then_acme(conn: Connection) -> int:
        n = next(runs)
        _append(conn, "zeta", f"run-z{n}", take_head=False)
        _append(conn, "acme", f"run-a{n}", take_head=False)
        return 2

    # It appends to heads it did not hold when it began: the writer runs it again holding them, in order.
    assert store.writer.run(zeta_then_acme) == 2
    assert store.writer.reorders == 2
    assert {r["partition"]: r["pseq"] for r in _rows(store)} == {"t:zeta": 1, "t:acme": 1}

    with store.engine.connect() as other, other.begin():  # acme's head held elsewhere: in order again
        lock_head(other, "t:acme")
        late = threading.Thread(target=store.writer.run, args=(zeta_then_acme,), daemon=True)
        late.start()
        late.join(timeout=1)  # it cannot finish while acme's head is held; it is not deadlocked either
        assert late.is_alive()
    late.join(timeout=20)
    assert not late.is_alive()
    assert {r["partition"]: r["pseq"] for r in _rows(store)} == {"t:zeta": 2, "t:acme": 2}
    assert store.verify().ok


@pytest.mark.postgres
def test_a_write_reads_under_the_head_it_appends_to(pg_tenants: Store) -> None:
    # Deciding one approval twice from two replicas: each reads it pending, then appends. The head
    # must cover the read, or both decisions would be recorded.
    from store.log import head_locked_at

    def reads_then_appends(conn: Connection) -> float | None:
        log = Append(conn)
        locked_at = head_locked_at(conn)  # the head is held before the work's first read
        log.add(_run_started("acme", f"run-{len(_rows_in(conn))}"))
        log.flush()
        return locked_at

    assert pg_tenants.writer.run(reads_then_appends) is not None


def _rows_in(conn: Connection) -> list[Any]:
    return list(conn.execute(select(events.c.seq)))


@pytest.mark.postgres
def test_concurrent_writers_of_many_tenants_keep_every_chain_gapless(pg_tenants: Store) -> None:
    store = pg_tenants
    from tests.store.racing import at_once

    def claim(n: int) -> None:
        store.admit(
            call_request(
                tool_call_id=f"tc-{n}", idempotency_key=f"k-{n}", tenant=f"t{n % 4}", run_id=f"run-{n}"
            )
        )

    at_once(claim, range(20))
    report = store.verify()
    assert report.ok, report
    assert set(_heads(store)) == {"", "t:t0", "t:t1", "t:t2", "t:t3"}


def test_a_revocation_in_a_bucketed_log_refuses_the_next_call_in_every_bucket(store: Store) -> None:
    scheme = Partitioning("tenant", buckets=4)
    configure(store.engine, scheme)
    runs = {scheme.partition_for("acme", f"run-{n}", None): f"run-{n}" for n in range(40)}
    assert sorted(runs) == list(scheme.tenant_partitions("acme"))
    store.revoke_principal(RevokePrincipal("acme", "alice", revoked_by="root", now=NOW))

    for n, run in enumerate(runs.values()):
        admitted = store.admit(call_request(tool_call_id=f"tc-{n}", idempotency_key=f"k-{n}", run_id=run))
        assert (admitted.call.status, admitted.call.reason) == ("denied", "principal_revoked")
    assert store.verify().ok


@pytest.mark.postgres
def test_a_revocation_waits_for_a_call_in_flight_in_any_bucket_of_its_tenant(pg_schema_url: str) -> None:
    # A call appends under its run's bucket and reads its subject's standing there. A revocation
    # recorded under one bucket only would let a call in flight in another commit after it, admitted.
    scheme = Partitioning("tenant", buckets=4)
    with Store.open(pg_schema_url, partitioning=scheme) as store:
        store.migrate()
        run = next(
            f"run-{n}" for n in range(40) if scheme.partition_for("acme", f"run-{n}", None) != "t:acme/0"
        )
        in_flight = store.engine.connect()
        admitting = in_flight.begin()
        lock_head(in_flight, scheme.partition_for("acme", run, None))  # as the writer does, first
        admitted = recording.admit(in_flight, call_request(tool_call_id="tc-1", run_id=run), producer="test")
        assert admitted.call.status == "dispatching"  # standing read: not revoked yet

        revoked = threading.Event()

        def revoke() -> None:
            store.revoke_principal(RevokePrincipal("acme", "alice", revoked_by="root", now=NOW))
            revoked.set()

        revoker = threading.Thread(target=revoke, daemon=True)
        revoker.start()
        assert not revoked.wait(timeout=1), "the revocation committed while a call of alice was in flight"
        admitting.commit()
        in_flight.close()
        assert revoked.wait(timeout=20)
        revoker.join(timeout=20)

        rows = _rows(store)
        revocation = next(r["seq"] for r in rows if r["type"] == "principal.revoked")
        assert all(r["seq"] < revocation for r in rows if r["tool_call_id"] == "tc-1")
        later = store.admit(call_request(tool_call_id="tc-2", idempotency_key="k-2", run_id=run))
        assert (later.call.status, later.call.reason) == ("denied", "principal_revoked")
        assert store.verify().ok


@pytest.mark.postgres
def test_a_follower_by_seq_never_passes_an_event_still_in_flight(pg_tenants: Store) -> None:
    # acme's write takes its seq first and commits last: a cursor at globex's higher seq would skip it.
    store = pg_tenants
    store.admit(call_request(tool_call_id="tc-0", idempotency_key="k-0", tenant="globex", run_id="run-0"))
    settled = [e["seq"] for e in store.export()]
    in_flight = store.engine.connect()
    writing = in_flight.begin()
    _append(in_flight, "acme", "run-late")
    store.admit(call_request(tool_call_id="tc-1", idempotency_key="k-1", tenant="globex", run_id="run-1"))

    assert [e["seq"] for e in store.export()] == settled  # nothing past the write in flight
    assert [e["seq"] for e in store.export(after_seq=settled[-1])] == []
    writing.commit()
    in_flight.close()

    rest = list(store.export(after_seq=settled[-1]))
    assert [e["type"] for e in rest][:1] == ["run.started"]  # the late commit, in its seq's place
    assert [e["seq"] for e in rest] == sorted(e["seq"] for e in rest)
    assert [e["seq"] for e in store.export()] == settled + [e["seq"] for e in rest]


@pytest.mark.postgres
def test_a_write_in_flight_rolled_back_holds_the_followers_back_no_longer(pg_tenants: Store) -> None:
    store = pg_tenants
    with store.engine.connect() as in_flight:
        writing = in_flight.begin()
        _append(in_flight, "acme", "run-abandoned")
        store.admit(call_request(tool_call_id="tc-1", idempotency_key="k-1", tenant="globex", run_id="run-1"))
        assert list(store.export()) == []
        writing.rollback()
    assert {e["run_id"] for e in store.export()} == {"run-1"}
    assert store.verify().ok
