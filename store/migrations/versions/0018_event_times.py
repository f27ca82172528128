"""`events.occurred_at` as 8 bytes instead of 27 characters (issue 16 item 8).

Every event kept its moment as the text `format_ts` writes; `store.schema.EventTime` keeps it as the
microseconds since 0001-01-01 UTC, big-endian (so the bytes sort as the text did, and the audit
export's and archiving's ranges on the column compare the same form), and reads back the very text,
which is what each event's hash covers: no hash changes, old checkpoints hold. Existing rows are
converted, since a range compares the stored forms: on PostgreSQL the column becomes bytea (text in
any other spelling kept as byte 0xFF and its UTF-8); on SQLite a TEXT column keeps a blob a blob.

Revision ID: 0018_event_times
Revises: 0017_run_indexes_in_runs
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from store.schema import time_bytes, time_text

revision = "0018_event_times"
down_revision = "0017_run_indexes_in_runs"
branch_labels = None
depends_on = None

_FORMATTED = r"'^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$'"


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        _sqlite_function("writ_time_bytes", lambda value: time_bytes(value) or value)
        op.execute(
            "UPDATE events SET occurred_at = writ_time_bytes(occurred_at) WHERE typeof(occurred_at) = 'text'"
        )
        return
    # As `time_bytes`: microseconds since 0001-01-01 (PostgreSQL's epoch is 1970: add the difference).
    op.alter_column(
        "events",
        "occurred_at",
        type_=sa.LargeBinary(),
        existing_type=sa.String(32),
        existing_nullable=False,
        postgresql_using=(
            f"CASE WHEN occurred_at ~ {_FORMATTED} THEN int8send(("
            "extract(epoch FROM occurred_at::timestamp) * 1000000 + 62135596800000000)::bigint) "
            "ELSE '\\xff'::bytea || convert_to(occurred_at, 'UTF8') END"
        ),
    )


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        _sqlite_function("writ_time_text", time_text)
        op.execute(
            "UPDATE events SET occurred_at = writ_time_text(occurred_at) WHERE typeof(occurred_at) = 'blob'"
        )
        return
    op.alter_column(
        "events",
        "occurred_at",
        type_=sa.String(32),
        existing_type=sa.LargeBinary(),
        existing_nullable=False,
        postgresql_using=(
            "CASE WHEN get_byte(occurred_at, 0) = 255 "
            "THEN convert_from(substring(occurred_at FROM 2), 'UTF8') "
            "ELSE to_char(timestamp '0001-01-01' + ('x' || encode(occurred_at, 'hex'))::bit(64)::bigint "
            "* interval '1 microsecond', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') END"
        ),
    )


def _sqlite_function(name: str, function: object) -> None:
    driver = op.get_bind().connection.driver_connection
    assert driver is not None
    driver.create_function(name, 1, function, deterministic=True)
