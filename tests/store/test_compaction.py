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
    settled_calls(store, 3)
    before = tamper.rows(store)
    assert isinstance(before[0]["hash"], str) and len(before[0]["hash"]) == 64  # hex in Python, as ever

    with store.engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0011_runs")
    with store.engine.connect() as conn:
        stored = conn.exec_driver_sql("SELECT prev_hash, hash FROM events ORDER BY seq").all()
        (head,) = conn.exec_driver_sql("SELECT last_hash FROM log_head").one()
    assert [tuple(r) for r in stored] == [(row["prev_hash"], row["hash"]) for row in before]  # hex text
    assert head == before[-1]["hash"]
    with store.engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "head")

    assert tamper.rows(store) == before
    with store.engine.connect() as conn:
        (raw,) = conn.exec_driver_sql("SELECT hash FROM events WHERE seq = 1").one()
    assert bytes(raw) == bytes.fromhex(before[0]["hash"])  # 32 bytes on disk
    assert store.verify().ok
    settled_calls(store, 1, first=4)
    # The ledger still refuses a second claim of a key: the call holding it answers.
    assert store.admit(call_request(tool_call_id="again", idempotency_key="k1")).call.tool_call_id == "tc-1"
    assert store.verify().ok
