"""Counters and loop marks that can be pruned once their window ended (issue 13).

`loop_marks.resets_at` is when a mark's window ends (from `tool_call.requested`'s loops and
`loop.detected`); marks recorded before are left with none and are never pruned. Both tables get an
index on `resets_at`, which the periodic prune walks in bounded batches.

Revision ID: 0014_expiring_marks
Revises: 0013_log_partitions
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from store.schema import UTCDateTime

revision = "0014_expiring_marks"
down_revision = "0013_log_partitions"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("loop_marks") as batch:
        batch.add_column(sa.Column("resets_at", UTCDateTime, nullable=True))
    op.create_index("ix_loop_marks_resets_at", "loop_marks", ["resets_at"])
    op.create_index("ix_budget_counters_resets_at", "budget_counters", ["resets_at"])


def downgrade() -> None:
    op.drop_index("ix_budget_counters_resets_at", table_name="budget_counters")
    op.drop_index("ix_loop_marks_resets_at", table_name="loop_marks")
    with op.batch_alter_table("loop_marks") as batch:
        batch.drop_column("resets_at")
