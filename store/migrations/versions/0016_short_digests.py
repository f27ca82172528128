"""Derived keys as bytes too: a text ending in 40 hex digits keeps them as 20 bytes (issue 16 item 8).

The gateway derives a key as `derived:` and the first 40 hex digits of a sha256; 0015 kept only
64-digit tails as bytes, so every derived key was still stored as 48 characters, in `tool_calls`
and in the effect ledger's key (on PostgreSQL also in its primary-key index). `store.schema.DigestText`
now stores such a text as byte 0xFD, the text before the digits and their 20 bytes; this converts the
rows written before, so a key is found in the form every lookup binds. A text ending in 64 digits
keeps its 0xFE form. The text read back is the text written: nothing hashed changes.

Revision ID: 0016_short_digests
Revises: 0015_packed_values
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

from store.schema import digest_bytes, digest_text

revision = "0016_short_digests"
down_revision = "0015_packed_values"
branch_labels = None
depends_on = None

# (table, column): every `DigestText` column.
_DIGESTS = (
    ("tool_calls", "action_hash"),
    ("tool_calls", "idempotency_key"),
    ("tool_calls", "contract_hash"),
    ("effect_ledger", "idempotency_key"),
    ("effect_ledger", "action_hash"),
)


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        _sqlite_function("writ_digest_bytes", lambda value: digest_bytes(value) or value)
        for table, column in _DIGESTS:
            op.execute(
                f"UPDATE {table} SET {column} = writ_digest_bytes({column}) WHERE typeof({column}) = 'text'"
            )
        return
    for table, column in _DIGESTS:
        # As `digest_bytes`: UTF-8 text (never byte 0xFE or 0xFD) ending in 40 lowercase hex digits.
        op.execute(
            f"UPDATE {table} SET {column} = '\\xfd'::bytea "
            f"|| substring({column} FROM 1 FOR length({column}) - 40) "
            f"|| decode(convert_from(substring({column} FROM length({column}) - 39), 'UTF8'), 'hex') "
            f"WHERE CASE WHEN length({column}) < 40 OR get_byte({column}, 0) IN (253, 254) THEN false "
            f"ELSE convert_from({column}, 'UTF8') ~ '[0-9a-f]{{40}}$' END"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        _sqlite_function("writ_digest_text", digest_text)
        for table, column in _DIGESTS:
            op.execute(
                f"UPDATE {table} SET {column} = writ_digest_text({column}) "
                f"WHERE typeof({column}) = 'blob' AND substr({column}, 1, 1) = x'fd'"
            )
        return
    for table, column in _DIGESTS:
        op.execute(
            f"UPDATE {table} SET {column} = substring({column} FROM 2 FOR length({column}) - 21) "
            f"|| convert_to(encode(substring({column} FROM length({column}) - 19), 'hex'), 'UTF8') "
            f"WHERE length({column}) > 20 AND get_byte({column}, 0) = 253"
        )


def _sqlite_function(name: str, function: object) -> None:
    driver = op.get_bind().connection.driver_connection
    assert driver is not None
    driver.create_function(name, 1, function, deterministic=True)
