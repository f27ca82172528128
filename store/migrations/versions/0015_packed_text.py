"""Event payloads and a call's JSON columns stored packed (issue 16 item 8, store.packing).

`events.payload` and `tool_calls.principal`, `arguments` and `result` are written deflated against a
preset dictionary, about a third of their text. What is hashed is still the text, which unpacking
gives back exactly, so no hash changes and old checkpoints still hold.

- PostgreSQL: the columns become bytea; each existing text is kept as its UTF-8 bytes, which the
  store reads back as the text it was (only new rows are packed).
- SQLite: no change to the schema: a TEXT column keeps a blob as a blob, and existing rows stay text.

The downgrade unpacks every packed value back into text.

Revision ID: 0015_packed_text
Revises: 0014_expiring_marks
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from store.packing import PACKED_1, unpack

revision = "0015_packed_text"
down_revision = "0014_expiring_marks"
branch_labels = None
depends_on = None

_COLUMNS = (
    ("events", "seq", "payload", False),
    ("tool_calls", "tool_call_id", "principal", False),
    ("tool_calls", "tool_call_id", "arguments", False),
    ("tool_calls", "tool_call_id", "result", True),
)


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        return
    for table, _, column, nullable in _COLUMNS:
        op.alter_column(
            table,
            column,
            type_=sa.LargeBinary(),
            existing_type=sa.Text(),
            existing_nullable=nullable,
            postgresql_using=f"convert_to({column}, 'UTF8')",
        )


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        driver = bind.connection.driver_connection
        assert driver is not None
        driver.create_function("writ_unpack", 1, unpack, deterministic=True)
        for table, _, column, _ in _COLUMNS:
            op.execute(f"UPDATE {table} SET {column} = writ_unpack({column}) WHERE typeof({column}) = 'blob'")
        return
    for table, key, column, nullable in _COLUMNS:
        packed = bind.execute(
            sa.text(f"SELECT {key}, {column} FROM {table} WHERE get_byte({column}, 0) = {PACKED_1}")
        ).all()
        if packed:
            bind.execute(
                sa.text(f"UPDATE {table} SET {column} = :text WHERE {key} = :key"),
                [{"key": row[0], "text": unpack(row[1]).encode("utf-8")} for row in packed],
            )
        op.alter_column(
            table,
            column,
            type_=sa.Text(),
            existing_type=sa.LargeBinary(),
            existing_nullable=nullable,
            postgresql_using=f"convert_from({column}, 'UTF8')",
        )
