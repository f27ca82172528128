"""A call's `created_at` and `updated_at` and the ledger's `claimed_at` as 8 bytes on SQLite (issue 16
item 8).

SQLite kept every timestamp as the 27 characters `format_ts` writes; these three are written for every
call (and `created_at` again in its index). `store.schema.CompactUTCDateTime` keeps them as the
microseconds since 0001-01-01 UTC, big-endian, which sort as the text did; this converts the rows
written before, since an ORDER BY or a comparison on the column compares the stored forms.
PostgreSQL's timestamptz is 8 bytes already: nothing to do there.

Revision ID: 0019_compact_call_times
Revises: 0018_event_times
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

from store.schema import time_bytes, time_text

revision = "0019_compact_call_times"
down_revision = "0018_event_times"
branch_labels = None
depends_on = None

_COLUMNS = (("tool_calls", "created_at"), ("tool_calls", "updated_at"), ("effect_ledger", "claimed_at"))


def upgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    _sqlite_function("writ_time_bytes", lambda value: time_bytes(value) or value)
    for table, column in _COLUMNS:
        op.execute(f"UPDATE {table} SET {column} = writ_time_bytes({column}) WHERE typeof({column}) = 'text'")


def downgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    _sqlite_function("writ_time_text", time_text)
    for table, column in _COLUMNS:
        op.execute(f"UPDATE {table} SET {column} = writ_time_text({column}) WHERE typeof({column}) = 'blob'")


def _sqlite_function(name: str, function: object) -> None:
    driver = op.get_bind().connection.driver_connection
    assert driver is not None
    driver.create_function(name, 1, function, deterministic=True)
