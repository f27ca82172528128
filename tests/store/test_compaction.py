"""The compacting migration (0012: no event_id index, seq as SQLite's rowid, the ledger WITHOUT ROWID)
keeps every event and its hash, both ways, and the ledger still refuses a second claim of a key."""

from __future__ import annotations

from alembic import command

from store import Store
from tests.store import tamper
from tests.store.builders import NOW, call_request, outcome


def settled_calls(store: Store, count: int, first: int = 1) -> None:
    for n in range(first, first + count):
        store.admit(call_request(tool_call_id=f"tc-{n}", idempotency_key=f"k{n}"))
        store.record_outcome(outcome(f"tc-{n}", "completed", result={"n": n}, now=NOW))


def test_the_compacting_migration_keeps_every_event_and_hash_and_its_downgrade_too(own_store: Store) -> None:
    store = own_store  # the downgrade changes the schema: never the suite's shared one
    config = store._alembic_config()
    with store.engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0011_runs")
    settled_calls(store, 3)
    before = tamper.rows(store)

    with store.engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "head")

    assert tamper.rows(store) == before
    assert store.verify().ok
    settled_calls(store, 1, first=4)  # the ledger still refuses a second claim of a key
    assert store.admit(call_request(tool_call_id="again", idempotency_key="k1")).call.tool_call_id == "tc-1"
    with store.engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0011_runs")
    assert tamper.rows(store)[: len(before)] == before
