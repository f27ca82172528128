"""Loop marks: the calls counted in each loop pattern, and the patterns found to loop (issue 13).

A projection of `tool_call.requested` (its `loops`) and `loop.detected`: on a log written before loop
detection existed it starts empty, which is what a rebuild would give.

Revision ID: 0007_loops
Revises: 0006_oauth
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_loops"
down_revision = "0006_oauth"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "loop_marks",
        sa.Column("pattern_key", sa.String(64), primary_key=True),
        sa.Column("tool_call_id", sa.String(128), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("loop_marks")
