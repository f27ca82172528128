"""Packed texts with their embedded JSON written out, against a second dictionary (issue 16 item 8).

`store.packing` now writes form 0x02: the text's strings that hold escaped quotes (an MCP result's
JSON text content, beside the `structuredContent` it repeats) written out, deflated against
`DICTIONARY_2`. Rows packed before (form 0x01) and rows kept as text read as they did, so upgrading
converts nothing. Code before this revision reads no 0x02: downgrading turns each such value back into
its text (UTF-8 on PostgreSQL), which every revision since 0015 reads as it is.

Revision ID: 0021_embedded_json
Revises: 0020_approvals_by_expiry
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from store.packing import PACKED_2, unpack

revision = "0021_embedded_json"
down_revision = "0020_approvals_by_expiry"
branch_labels = None
depends_on = None

_PACKED = (
    ("events", "seq", "payload"),
    ("tool_calls", "tool_call_id", "principal"),
    ("tool_calls", "tool_call_id", "arguments"),
    ("tool_calls", "tool_call_id", "result"),
)


def upgrade() -> None:
    """Nothing to convert: every form written before reads as it did."""


def downgrade() -> None:
    bind = op.get_bind()
    sqlite = bind.dialect.name == "sqlite"
    marker = f"x'{PACKED_2:02x}'" if sqlite else f"'\\x{PACKED_2:02x}'::bytea"
    for table, key, column in _PACKED:
        blob = f"typeof({column}) = 'blob' AND " if sqlite else ""
        rows = bind.execute(
            sa.text(f"SELECT {key}, {column} FROM {table} WHERE {blob}substr({column}, 1, 1) = {marker}")
        ).all()
        if rows:
            bind.execute(
                sa.text(f"UPDATE {table} SET {column} = :text WHERE {key} = :key"),
                [
                    {"key": row[0], "text": unpack(row[1]) if sqlite else unpack(row[1]).encode("utf-8")}
                    for row in rows
                ],
            )
