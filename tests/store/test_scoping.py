"""An idempotency key is its principal's own, and every identifier within its documented limit fits."""

from __future__ import annotations

from typing import Any

from alembic import command
from sqlalchemy import Column, select

from capabilities.contract import NAME_CHARS
from store import PrincipalRecord, Store
from store.limits import CLIENT_ID_CHARS, SUBJECT_CHARS, TENANT_CHARS
from store.schema import effect_ledger, metadata
from tests.store.builders import call_request


def as_bob(**changes: Any) -> Any:
    principal = PrincipalRecord("bob", "acme", roles=("agent",), client_id="c")
    return call_request(subject="bob", principal=principal, **changes)


def test_another_subjects_call_with_my_key_and_my_action_is_a_call_of_its_own(store: Store) -> None:
    mine = store.admit(call_request(tool_call_id="tc-alice"))

    theirs = store.admit(as_bob(tool_call_id="tc-bob"))

    assert (theirs.kind, theirs.call.tool_call_id, theirs.call.status) == ("new", "tc-bob", "dispatching")
    assert store.find_call_by_key("acme", "alice", "key-1") == mine.call
    assert store.find_call_by_key("acme", "bob", "key-1") == theirs.call


def test_another_subjects_call_with_my_key_and_another_action_is_no_conflict(store: Store) -> None:
    store.admit(call_request(tool_call_id="tc-alice"))

    theirs = store.admit(as_bob(tool_call_id="tc-bob", action_hash="action-b"))

    assert (theirs.kind, theirs.existing, theirs.call.status) == ("new", None, "dispatching")
    assert "tc-alice" not in str([e.payload for e in store.events(tool_call_id="tc-bob")])


def test_the_same_subjects_key_with_another_action_still_conflicts(store: Store) -> None:
    store.admit(call_request(tool_call_id="tc-1"))

    again = store.admit(call_request(tool_call_id="tc-2", action_hash="action-b"))

    assert again.kind == "conflict" and again.existing is not None and again.existing.tool_call_id == "tc-1"


def test_the_ledger_is_rebuilt_with_each_claims_subject(store: Store) -> None:
    store.admit(call_request(tool_call_id="tc-alice"))
    store.admit(as_bob(tool_call_id="tc-bob", action_hash="action-b"))

    store.rebuild()

    with store.engine.connect() as conn:
        rows = conn.execute(select(effect_ledger.c.subject, effect_ledger.c.tool_call_id)).all()
    assert sorted(map(tuple, rows)) == [("alice", "tc-alice"), ("bob", "tc-bob")]


def test_upgrading_from_0001_gives_each_claim_its_calls_subject_and_downgrading_keeps_the_first(
    own_store: Store,
) -> None:
    store = own_store  # the downgrade changes the schema: never the suite's shared one
    store.admit(call_request(tool_call_id="tc-alice"))
    store.admit(as_bob(tool_call_id="tc-bob", action_hash="action-b"))
    config = store._alembic_config()

    with store.engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0001")
    with store.engine.connect() as conn:
        narrow = conn.exec_driver_sql("SELECT idempotency_key, tool_call_id FROM effect_ledger").all()
    assert [tuple(r) for r in narrow] == [("key-1", "tc-alice")]  # both claimed at NOW: the lower id
    with store.engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "head")

    assert store.is_migrated()
    with store.engine.connect() as conn:
        rows = conn.execute(select(effect_ledger.c.subject, effect_ledger.c.tool_call_id)).all()
    assert [tuple(r) for r in rows] == [("alice", "tc-alice")]


def _columns(*names: str) -> list[Column[Any]]:
    found = [c for table in metadata.tables.values() for c in table.columns if c.name in names]
    assert found
    return found


def test_every_column_holding_an_identifier_is_at_least_its_documented_limit() -> None:
    # PostgreSQL refuses a longer value (a database error mid-call); SQLite keeps it: the limits the
    # edges enforce must fit the narrower of the two.
    # Pairs, not a dict keyed by limit: two limits of one length would keep only the last's columns.
    limits = [
        (TENANT_CHARS, _columns("tenant")),
        (SUBJECT_CHARS, _columns("subject", "requester", "decided_by", "revoked_by", "resolved_by")),
        (CLIENT_ID_CHARS, _columns("idempotency_key")),
        (NAME_CHARS, _columns("tool_name", "capability_id")),  # what capabilities let be called
    ]
    for limit, columns in limits:
        for column in columns:
            length = getattr(column.type, "length", None)
            assert length is not None and length >= limit, (column.table.name, column.name, length, limit)
