"""Rate-limit buckets shared by every replica (issue 17, item 7).

Revision ID: 0002_rate_limits
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_rate_limits"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # UNLOGGED on PostgreSQL: soft state whose loss in a crash only forgets recent calls.
    prefixes = ["UNLOGGED"] if op.get_bind().dialect.name == "postgresql" else []
    op.create_table(
        "rate_buckets",
        sa.Column("bucket", sa.String(512), primary_key=True),
        sa.Column("tat", sa.Float(precision=53), nullable=False),
        prefixes=prefixes,
    )


def downgrade() -> None:
    op.drop_table("rate_buckets")
