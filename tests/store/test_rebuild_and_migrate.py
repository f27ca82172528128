"""The projections can be rebuilt from the log alone; migrating is idempotent and matches the tables."""

from __future__ import annotations

from datetime import timedelta

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from store import Store
from store.model import CorruptEvent
from store.schema import PROJECTION_TABLES, metadata
from tests.store import tamper
from tests.store.builders import DENY, NOW, REQUIRE_APPROVAL, call_request, outcome, refusal_request
from tests.store.histories import projections


def record_a_varied_history(store: Store) -> None:
    store.admit(call_request(tool_call_id="done", idempotency_key="k1"))
    store.record_outcome(outcome("done", "completed", result={"ok": 1}, now=NOW))
    store.admit(call_request(tool_call_id="denied", idempotency_key="k2", decision=DENY))
    store.admit(
        call_request(
            tool_call_id="pending", idempotency_key="k3", decision=REQUIRE_APPROVAL, contract_hash="sha256:c1"
        )
    )
    store.admit(call_request(tool_call_id="conflict", idempotency_key="k1", action_hash="other"))
    store.admit(call_request(tool_call_id="d1", idempotency_key="kd", key_source="derived", run_id="run-2"))
    store.record_outcome(outcome("d1", "failed", error="no", now=NOW))
    later = NOW + timedelta(minutes=1)
    store.admit(call_request(tool_call_id="d2", idempotency_key="kd", key_source="derived", now=later))
    store.record_outcome(outcome("d2", "unknown", error="timeout", now=later))
    store.refuse(refusal_request(tool_call_id="refused", run_id="run-3", run_origin="client"))


def test_rebuild_reproduces_the_projections_and_ledger_exactly(store: Store) -> None:
    record_a_varied_history(store)
    before = projections(store)

    replayed = store.rebuild()

    assert replayed == len(store.events())
    assert projections(store) == before
    assert before["effect_ledger"] and before["approvals"] and before["runs"]
    assert [c["contract_hash"] for c in before["tool_calls"] if c["contract_hash"]] == ["sha256:c1"]


def test_each_write_returns_the_call_exactly_as_a_later_read_finds_it(store: Store) -> None:
    # A write's view is built from the row the write itself returned, not from a second read.
    new_run = call_request(tool_call_id="a", idempotency_key="k1", run_id="run-new", run_origin="client")
    writes = [
        lambda: store.admit(new_run).call,
        lambda: store.record_outcome(outcome("a", "completed", result={"ok": 1}, now=NOW)),
        lambda: store.admit(call_request(tool_call_id="b", idempotency_key="k2", decision=DENY)).call,
        lambda: (
            store.admit(call_request(tool_call_id="c", idempotency_key="k3", decision=REQUIRE_APPROVAL)).call
        ),
        lambda: store.admit(call_request(tool_call_id="d", idempotency_key="k1", action_hash="other")).call,
        lambda: store.refuse(refusal_request(tool_call_id="e", run_id="run-3", run_origin="client")),
    ]
    for write in writes:
        call = write()
        assert store.get_call(call.tool_call_id) == call

    assert store.run_call_count("run-new", "acme") == 1
    assert store.run_call_count("run-3", "acme") == 1


def test_rebuild_restores_a_wiped_ledger_so_keys_stay_claimed(store: Store) -> None:
    record_a_varied_history(store)
    with store.engine.begin() as conn:
        for table in PROJECTION_TABLES:
            conn.execute(table.delete())

    store.rebuild()

    again = store.admit(call_request(tool_call_id="again", idempotency_key="k1"))
    assert (again.kind, again.call.tool_call_id) == ("joined", "done")
    assert store.verify().ok


@pytest.mark.parametrize("payload", ["{not json", "[1]"])
def test_rebuild_and_export_of_a_log_with_a_mangled_payload_name_the_event_and_keep_projections(
    store: Store, payload: str
) -> None:
    # json.loads or the event model raised out of `writ store rebuild` and `writ audit export`.
    record_a_varied_history(store)
    before = projections(store)
    tamper.set_payload_text(store, 1, payload)

    with pytest.raises(CorruptEvent, match="event 1 .*writ audit verify"):
        store.rebuild()
    assert projections(store) == before
    if payload == "{not json":  # export copies any JSON out as it is
        with pytest.raises(CorruptEvent, match="event 1 .*writ audit verify"):
            list(store.export())


def test_migrate_is_idempotent(store: Store) -> None:
    store.admit(call_request())

    store.migrate()
    store.migrate()

    assert store.is_migrated()
    assert len(store.events()) == 3


def test_a_fresh_database_is_not_migrated_until_migrate_runs(store_url: str) -> None:
    with Store.open(store_url) as fresh:
        assert not fresh.is_migrated()
        fresh.migrate()
        assert fresh.is_migrated()


def test_the_migrated_schema_matches_the_table_definitions(store: Store) -> None:
    with store.engine.connect() as conn:
        differences = compare_metadata(MigrationContext.configure(conn), metadata)

    assert differences == []
