"""Budget counters: the sums of the charges calls recorded, per budget, scope and window (issue 13).

A projection of `tool_call.requested`: on a log written before budgets existed it starts empty, which
is what a rebuild would give.

Revision ID: 0005_budgets
Revises: 0004_scoping
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from store.schema import UTCDateTime

revision = "0005_budgets"
down_revision = "0004_scoping"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "budget_counters",
        sa.Column("counter_key", sa.String(64), primary_key=True),
        sa.Column("budget_id", sa.String(256), nullable=False),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("used_micros", sa.BigInteger, nullable=False),
        sa.Column("window_start", UTCDateTime),
        sa.Column("resets_at", UTCDateTime),
    )


def downgrade() -> None:
    op.drop_table("budget_counters")
