"""A smaller store per call (issue 16): no index on `events.event_id`, `seq` as SQLite's rowid, the
effect ledger clustered on its key.

- `event_id`'s unique index: no query looks an event up by its id (the log is read by seq, call, run or
  tenant), and ids are UUIDv7s minted by the writer, so the index only cost every event a B-tree entry
  (about 50 bytes on SQLite, 64 on PostgreSQL).
- SQLite: `seq BIGINT PRIMARY KEY` is not an alias of the rowid (only `INTEGER PRIMARY KEY` is), so
  every event had a rowid and, beside it, an index of its seq. Rebuilt with `seq INTEGER PRIMARY KEY`:
  the table is its own seq index. Nothing of an event's content changes, so every hash stays as it was.
- SQLite: `effect_ledger` WITHOUT ROWID, so its primary key (tenant, subject, idempotency key: most of
  the row) is stored once, in the table, instead of again in an index beside it.

Revision ID: 0012_compact_store
Revises: 0011_runs
Create Date: 2026-12-02
"""

from __future__ import annotations

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


def upgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        op.drop_constraint("events_event_id_key", "events", type_="unique")
        return
    _events("events_next", seq_type=sa.Integer, unique_event_id=False)
    _ledger("effect_ledger_next", with_rowid=False)
    _move_tables()


def downgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        op.create_unique_constraint("events_event_id_key", "events", ["event_id"])
        return
    _events("events_next", seq_type=sa.BigInteger, unique_event_id=True)
    _ledger("effect_ledger_next", with_rowid=True)
    _move_tables()


def _move_tables() -> None:
    op.execute(f"INSERT INTO events_next ({_EVENT_COLUMNS}) SELECT {_EVENT_COLUMNS} FROM events")
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


def _events(name: str, *, seq_type: type[sa.Integer] | type[sa.BigInteger], unique_event_id: bool) -> None:
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
        sa.Column("prev_hash", sa.String(64), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
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
