"""Tool call ids the gateway mints in 17 bytes instead of 31 characters (issue 16 item 8).

A call's id (`tc_` and 28 hex digits: a millisecond time and 8 random bytes) is in every event of the
call, in `ix_events_tool_call_id`, in the call's row and its primary key, and in the effect ledger:
about 170 bytes a write on SQLite. `store.schema.CallId` stores such an id as byte 0xFC, its prefix and
the 14 bytes of its digits, any other id as it is. Every column that holds a tool_call_id gets the type
at once, so lookups and joins compare one form with the same; this converts the rows written before.
The text read back is the text written: nothing hashed changes.

On PostgreSQL the ALTERs rewrite the seven tables and their indexes under an exclusive lock, so calls
wait for `writ store migrate` to finish. A gateway of an earlier revision would still write and look
up ids as text, which no longer matches the stored form: stop every replica, migrate, then start them
on this revision (as for 0015's ids and digests).

Revision ID: 0022_short_call_ids
Revises: 0021_embedded_json
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from store.schema import call_id_bytes, call_id_text

revision = "0022_short_call_ids"
down_revision = "0021_embedded_json"
branch_labels = None
depends_on = None

# (table, nullable): every table with a tool_call_id column.
_CALL_IDS = (
    ("events", True),
    ("tool_calls", False),
    ("approvals", False),
    ("effect_ledger", False),
    ("held_arguments", False),
    ("outbox", True),
    ("loop_marks", False),
)


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        _sqlite_function("writ_call_id_bytes", lambda value: call_id_bytes(value) or value)
        for table, _ in _CALL_IDS:
            op.execute(
                f"UPDATE {table} SET tool_call_id = writ_call_id_bytes(tool_call_id) "
                "WHERE typeof(tool_call_id) = 'text'"
            )
        return
    for table, nullable in _CALL_IDS:
        # As `call_id_bytes`: byte 0xFC, the prefix before `_`, then the 14 bytes of the 28 digits.
        op.alter_column(
            table,
            "tool_call_id",
            type_=sa.LargeBinary(),
            existing_type=sa.String(128),
            existing_nullable=nullable,
            postgresql_using=(
                "CASE WHEN tool_call_id ~ '^[a-z]{1,16}_[0-9a-f]{28}$' THEN '\\xfc'::bytea "
                "|| convert_to(left(tool_call_id, -29), 'UTF8') || decode(right(tool_call_id, 28), 'hex') "
                "ELSE convert_to(tool_call_id, 'UTF8') END"
            ),
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        _sqlite_function("writ_call_id_text", call_id_text)
        for table, _ in _CALL_IDS:
            op.execute(
                f"UPDATE {table} SET tool_call_id = writ_call_id_text(tool_call_id) "
                "WHERE typeof(tool_call_id) = 'blob'"
            )
        return
    for table, nullable in _CALL_IDS:
        op.alter_column(
            table,
            "tool_call_id",
            type_=sa.String(128),
            existing_type=sa.LargeBinary(),
            existing_nullable=nullable,
            postgresql_using=(
                # Branches in order, so get_byte never sees an empty value.
                "CASE WHEN length(tool_call_id) NOT BETWEEN 16 AND 31 "
                "THEN convert_from(tool_call_id, 'UTF8') "
                "WHEN get_byte(tool_call_id, 0) = 252 "
                "THEN convert_from(substring(tool_call_id FROM 2 FOR length(tool_call_id) - 15), 'UTF8') "
                "|| '_' || encode(substring(tool_call_id FROM length(tool_call_id) - 13), 'hex') "
                "ELSE convert_from(tool_call_id, 'UTF8') END"
            ),
        )


def _sqlite_function(name: str, function: object) -> None:
    driver = op.get_bind().connection.driver_connection
    assert driver is not None
    driver.create_function(name, 1, function, deterministic=True)
