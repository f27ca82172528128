"""The effect ledger is keyed by subject too: an idempotency key is its principal's own.

Before, (tenant, idempotency_key) was unique, so another agent of the tenant sending my key joined my
call (and got my result) or was refused with my call's id. Each claim's subject is its call's.

Revision ID: 0004_scoping
Revises: 0003_contract_hash
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from store.schema import UTCDateTime

revision = "0004_scoping"
down_revision = "0003_contract_hash"
branch_labels = None
depends_on = None

_COLUMNS = "tenant, idempotency_key, tool_call_id, action_hash, key_source, claimed_at"


def _ledger(name: str, *, with_subject: bool) -> None:
    key = ["tenant", "subject", "idempotency_key"] if with_subject else ["tenant", "idempotency_key"]
    op.create_table(
        name,
        sa.Column("tenant", sa.String(128), nullable=False),
        *([sa.Column("subject", sa.String(256), nullable=False)] if with_subject else []),
        sa.Column("idempotency_key", sa.String(256), nullable=False),
        sa.Column("tool_call_id", sa.String(128), nullable=False),
        sa.Column("action_hash", sa.String(128), nullable=False),
        sa.Column("key_source", sa.String(16), nullable=False),
        sa.Column("claimed_at", UTCDateTime, nullable=False),
        sa.PrimaryKeyConstraint(*key, name=f"{name}_pkey"),
    )


def _swap(with_subject: bool, copy: str) -> None:
    # A primary key cannot be altered in place on SQLite: build the new table, copy, swap names.
    _ledger("effect_ledger_next", with_subject=with_subject)
    op.execute(copy)
    op.drop_table("effect_ledger")
    op.rename_table("effect_ledger_next", "effect_ledger")
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "ALTER TABLE effect_ledger RENAME CONSTRAINT effect_ledger_next_pkey TO effect_ledger_pkey"
        )


def upgrade() -> None:
    _swap(
        True,
        f"INSERT INTO effect_ledger_next (subject, {_COLUMNS}) "
        f"SELECT c.subject, {', '.join('l.' + c for c in _COLUMNS.split(', '))} "
        "FROM effect_ledger l JOIN tool_calls c ON c.tool_call_id = l.tool_call_id",
    )


def downgrade() -> None:
    # Two subjects' claims of one key cannot both survive the narrower key: the first claimed stays.
    _swap(
        False,
        f"INSERT INTO effect_ledger_next ({_COLUMNS}) SELECT {_COLUMNS} FROM effect_ledger l "
        "WHERE NOT EXISTS (SELECT 1 FROM effect_ledger o WHERE o.tenant = l.tenant "
        "AND o.idempotency_key = l.idempotency_key AND (o.claimed_at < l.claimed_at "
        "OR (o.claimed_at = l.claimed_at AND o.tool_call_id < l.tool_call_id)))",
    )
