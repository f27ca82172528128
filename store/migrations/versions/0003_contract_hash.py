"""The capability contract a call was requested under, kept beside it.

An approval binds the contract, not its label: re-authorization compares the call's contract hash with
the capability's current one, and the console says when they differ. Nullable: calls recorded before
this revision have none (the action hash they stored did not cover one either).

Revision ID: 0003_contract_hash
Revises: 0002_rate_limits
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_contract_hash"
down_revision = "0002_rate_limits"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tool_calls") as batch:
        batch.add_column(sa.Column("contract_hash", sa.String(80), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tool_calls") as batch:
        batch.drop_column("contract_hash")
