"""A smaller store per call (issue 16): no index on `events.event_id`, `seq` as SQLite's rowid, the
effect ledger clustered on its key.

- `event_id`'s unique index: no query looks an event up by its id (the log is read by seq, call, run or
  tenant), and ids are UUIDv7s minted by the writer, so the index only cost every event a B-tree entry
  (about 50 bytes on SQLite, 64 on PostgreSQL).
- SQLite: `seq BIGINT PRIMARY KEY` is not an alias of the rowid (only `INTEGER PRIMARY KEY` is), so
  every event had a rowid and, beside it, an index of its seq. Rebuilt with `seq INTEGER PRIMARY KEY`:
  the table is its own seq index. Nothing of an event's content changes, so every hash stays as it was.
- `prev_hash`, `hash` and the head's `last_hash` as 32 bytes instead of 64 hex characters. What an
  event hashes to is computed over the hex spelling as before (the store reads the bytes back as hex),
  so no hash changes.
- SQLite: `effect_ledger` WITHOUT ROWID, so its primary key (tenant, subject, idempotency key: most of
  the row) is stored once, in the table, instead of again in an index beside it.

Revision ID: 0012_compact_store
Revises: 0011_runs
Create Date: 2026-12-02
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

from store.schema import UTCDateTime

revision = "0012_compact_store"
down_revision = "0011_runs"
branch_labels = None
depends_on = None

_EVENT_COLUMNS = (
    "seq, event_id, type, schema_version, occurred_at, producer, run_id, tool_call_id, approval_id, "
    "capability_id, capability_version, policy_version, correlation_id, causation_id, tenant, payload, "
    "prev_hash, hash"
)
_LEDGER_COLUMNS = "tenant, subject, idempotency_key, tool_call_id, action_hash, key_source, claimed_at"
_EVENT_INDEXES = (
    ("ix_events_run_id", ["run_id"]),
    ("ix_events_tool_call_id", ["tool_call_id"]),
    ("ix_events_tenant_seq", ["tenant", "seq"]),
)


_HASHES = (("events", "prev_hash"), ("events", "hash"), ("log_head", "last_hash"))


def upgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        op.drop_constraint("events_event_id_key", "events", type_="unique")
        for table, column in _HASHES:
            op.alter_column(
                table,
                column,
                type_=sa.LargeBinary(32),
                existing_type=sa.String(64),
                existing_nullable=False,
                postgresql_using=f"decode({column}, 'hex')",
            )
        return
    _sqlite_function("writ_unhex", _unhex)
    _events("events_next", seq_type=sa.Integer, unique_event_id=False, hash_type=sa.LargeBinary(32))
    _ledger("effect_ledger_next", with_rowid=False)
    _move_tables("writ_unhex")
    _sqlite_head(sa.LargeBinary(32), "writ_unhex")


def downgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        for table, column in _HASHES:
            op.alter_column(
                table,
                column,
                type_=sa.String(64),
                existing_type=sa.LargeBinary(32),
                existing_nullable=False,
                postgresql_using=f"encode({column}, 'hex')",
            )
        op.create_unique_constraint("events_event_id_key", "events", ["event_id"])
        return
    _sqlite_function("writ_hex", _hex)
    _events("events_next", seq_type=sa.BigInteger, unique_event_id=True, hash_type=sa.String(64))
    _ledger("effect_ledger_next", with_rowid=True)
    _move_tables("writ_hex")
    _sqlite_head(sa.String(64), "writ_hex")


def _unhex(value: bytes | str) -> bytes:
    return value if isinstance(value, bytes) else bytes.fromhex(value)


def _hex(value: bytes | str) -> str:
    return value if isinstance(value, str) else value.hex()


def _sqlite_function(name: str, function: Any) -> None:
    # SQLite before 3.41 has no unhex(), and its hex() is upper case: the conversion is done in Python.
    driver = op.get_bind().connection.driver_connection
    assert driver is not None
    driver.create_function(name, 1, function, deterministic=True)


def _sqlite_head(hash_type: sa.types.TypeEngine[Any], convert: str) -> None:
    # Converted before the column's type changes: the table's copy CASTs the value to the new type,
    # which would read bytes as text.
    op.execute(f"UPDATE log_head SET last_hash = {convert}(last_hash)")
    with op.batch_alter_table("log_head") as batch:
        batch.alter_column("last_hash", type_=hash_type, existing_nullable=False)


def _move_tables(convert: str) -> None:
    converted = _EVENT_COLUMNS.replace("prev_hash, hash", f"{convert}(prev_hash), {convert}(hash)")
    op.execute(f"INSERT INTO events_next ({_EVENT_COLUMNS}) SELECT {converted} FROM events")
    op.execute(
        f"INSERT INTO effect_ledger_next ({_LEDGER_COLUMNS}) SELECT {_LEDGER_COLUMNS} FROM effect_ledger"
    )
    for name, _ in _EVENT_INDEXES:
        op.drop_index(name, table_name="events")
    op.drop_table("events")
    op.drop_table("effect_ledger")
    op.rename_table("events_next", "events")
    op.rename_table("effect_ledger_next", "effect_ledger")
    for name, columns in _EVENT_INDEXES:
        op.create_index(name, "events", columns)


def _events(
    name: str,
    *,
    seq_type: type[sa.Integer] | type[sa.BigInteger],
    unique_event_id: bool,
    hash_type: sa.types.TypeEngine[Any],
) -> None:
    op.create_table(
        name,
        sa.Column("seq", seq_type, primary_key=True, autoincrement=False),
        sa.Column("event_id", sa.String(64), nullable=False, unique=unique_event_id),
        sa.Column("type", sa.String(64), nullable=False),
        sa.Column("schema_version", sa.Integer, nullable=False),
        sa.Column("occurred_at", sa.String(32), nullable=False),
        sa.Column("producer", sa.String(128), nullable=False),
        sa.Column("run_id", sa.String(128)),
        sa.Column("tool_call_id", sa.String(128)),
        sa.Column("approval_id", sa.String(128)),
        sa.Column("capability_id", sa.String(256)),
        sa.Column("capability_version", sa.String(64)),
        sa.Column("policy_version", sa.String(128)),
        sa.Column("correlation_id", sa.String(256)),
        sa.Column("causation_id", sa.String(64)),
        sa.Column("tenant", sa.String(128)),
        sa.Column("payload", sa.Text, nullable=False),
        sa.Column("prev_hash", hash_type, nullable=False),
        sa.Column("hash", hash_type, nullable=False),
    )


def _ledger(name: str, *, with_rowid: bool) -> None:
    op.create_table(
        name,
        sa.Column("tenant", sa.String(128), primary_key=True),
        sa.Column("subject", sa.String(256), primary_key=True),
        sa.Column("idempotency_key", sa.String(256), primary_key=True),
        sa.Column("tool_call_id", sa.String(128), nullable=False),
        sa.Column("action_hash", sa.String(128), nullable=False),
        sa.Column("key_source", sa.String(16), nullable=False),
        sa.Column("claimed_at", UTCDateTime, nullable=False),
        sqlite_with_rowid=with_rowid,
    )
