"""A smaller store per call (issue 16 item 8): JSON text packed, event ids and digests as bytes.

- `events.payload` and `tool_calls.principal`, `arguments` and `result` are written deflated against
  a preset dictionary (store.packing), about a third of their text. On PostgreSQL the columns become
  bytea and each existing text is kept as its UTF-8, which the store reads back as it is (only new
  rows are packed); on SQLite a TEXT column keeps a blob as a blob, so its schema does not change.
- `events.event_id`, `events.causation_id` and `tool_calls.last_event_id`: a UUID's 16 bytes instead
  of its 36 characters (any other id: byte 0xFF and its UTF-8, `store.schema.EventId`), existing rows
  converted.
- A call's `action_hash`, `idempotency_key` and `contract_hash`, and the ledger's key and action
  hash: a text ending in a sha256 hex digest (a derived key is `derived:<hex>`) keeps the digest as
  its 32 bytes (`store.schema.DigestText`), existing rows converted; other text is kept as it is.

What is hashed is still the text the store reads back, which is exactly what was written, so no
hash changes and old checkpoints still hold. The downgrade turns every value back into text.

Revision ID: 0015_packed_values
Revises: 0014_expiring_marks
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from store.packing import PACKED_1, unpack
from store.schema import digest_bytes, digest_text, id_bytes, id_text

revision = "0015_packed_values"
down_revision = "0014_expiring_marks"
branch_labels = None
depends_on = None

# (table, key, column, nullable)
_PACKED = (
    ("events", "seq", "payload", False),
    ("tool_calls", "tool_call_id", "principal", False),
    ("tool_calls", "tool_call_id", "arguments", False),
    ("tool_calls", "tool_call_id", "result", True),
)
_IDS = (
    ("events", "event_id", False),
    ("events", "causation_id", True),
    ("tool_calls", "last_event_id", False),
)
# (table, column, length, nullable)
_DIGESTS = (
    ("tool_calls", "action_hash", 128, False),
    ("tool_calls", "idempotency_key", 256, False),
    ("tool_calls", "contract_hash", 80, True),
    ("effect_ledger", "idempotency_key", 256, False),
    ("effect_ledger", "action_hash", 128, False),
)
_UUID = "'^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'"


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        _sqlite_function("writ_id_bytes", id_bytes)
        _sqlite_function("writ_digest_bytes", lambda value: digest_bytes(value) or value)
        for table, column, convert in [(t, c, "writ_id_bytes") for t, c, _ in _IDS] + [
            (t, c, "writ_digest_bytes") for t, c, _, _ in _DIGESTS
        ]:
            op.execute(f"UPDATE {table} SET {column} = {convert}({column}) WHERE typeof({column}) = 'text'")
        return
    for table, _, column, nullable in _PACKED:
        op.alter_column(
            table,
            column,
            type_=sa.LargeBinary(),
            existing_type=sa.Text(),
            existing_nullable=nullable,
            postgresql_using=f"convert_to({column}, 'UTF8')",
        )
    for table, column, nullable in _IDS:
        # As `id_bytes`: a UUID in its canonical spelling whose first byte is not 0xFF, as its 16 bytes.
        op.alter_column(
            table,
            column,
            type_=sa.LargeBinary(),
            existing_type=sa.String(64),
            existing_nullable=nullable,
            postgresql_using=(
                f"CASE WHEN {column} ~ {_UUID} AND left({column}, 2) <> 'ff' "
                f"THEN decode(replace({column}, '-', ''), 'hex') "
                f"ELSE '\\xff'::bytea || convert_to({column}, 'UTF8') END"
            ),
        )
    for table, column, length, nullable in _DIGESTS:
        # As `digest_bytes`: byte 0xFE, what comes before the digest, then the digest's 32 bytes.
        op.alter_column(
            table,
            column,
            type_=sa.LargeBinary(),
            existing_type=sa.String(length),
            existing_nullable=nullable,
            postgresql_using=(
                f"CASE WHEN {column} ~ '[0-9a-f]{{64}}$' THEN '\\xfe'::bytea "
                f"|| convert_to(left({column}, -64), 'UTF8') || decode(right({column}, 64), 'hex') "
                f"ELSE convert_to({column}, 'UTF8') END"
            ),
        )


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        _sqlite_function("writ_unpack", unpack)
        _sqlite_function("writ_id_text", id_text)
        _sqlite_function("writ_digest_text", digest_text)
        for table, column, convert in (
            [(t, c, "writ_unpack") for t, _, c, _ in _PACKED]
            + [(t, c, "writ_id_text") for t, c, _ in _IDS]
            + [(t, c, "writ_digest_text") for t, c, _, _ in _DIGESTS]
        ):
            op.execute(f"UPDATE {table} SET {column} = {convert}({column}) WHERE typeof({column}) = 'blob'")
        return
    for table, key, column, nullable in _PACKED:
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
    for table, column, nullable in _IDS:
        op.alter_column(
            table,
            column,
            type_=sa.String(64),
            existing_type=sa.LargeBinary(),
            existing_nullable=nullable,
            postgresql_using=(
                f"CASE WHEN get_byte({column}, 0) = 255 "
                f"THEN convert_from(substring({column} FROM 2), 'UTF8') "
                f"ELSE regexp_replace(encode({column}, 'hex'), "
                "'^(.{8})(.{4})(.{4})(.{4})(.{12})$', '\\1-\\2-\\3-\\4-\\5') END"
            ),
        )

    for table, column, length, nullable in _DIGESTS:
        op.alter_column(
            table,
            column,
            type_=sa.String(length),
            existing_type=sa.LargeBinary(),
            existing_nullable=nullable,
            postgresql_using=(
                f"CASE WHEN get_byte({column}, 0) = 254 "
                f"THEN convert_from(substring({column} FROM 2 FOR length({column}) - 33), 'UTF8') "
                f"|| encode(substring({column} FROM length({column}) - 31), 'hex') "
                f"ELSE convert_from({column}, 'UTF8') END"
            ),
        )


def _sqlite_function(name: str, function: object) -> None:
    driver = op.get_bind().connection.driver_connection
    assert driver is not None
    driver.create_function(name, 1, function, deterministic=True)
