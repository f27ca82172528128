"""Calls found by when their next lookup is due, only those with one scheduled: failures re-checked.

A `failed` that rests on finding nothing after the commit horizon is looked up again a few times
(`next_reconcile_at`), in case the backend commits past its horizon. Every replica asks, once a second,
whether such a re-check is due (store.agenda, `due_for_recheck`); the only index leading with `status`
would answer it by reading every failed call, a set that only grows. Few calls have a lookup or a
re-check scheduled at any time: `(status, next_reconcile_at)` over those alone answers it from them.

Revision ID: 0024_rechecks_by_time
Revises: 0023_console_sessions
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0024_rechecks_by_time"
down_revision = "0023_console_sessions"
branch_labels = None
depends_on = None

_SCHEDULED = sa.text("next_reconcile_at IS NOT NULL")


def upgrade() -> None:
    op.create_index(
        "ix_tool_calls_status_next_reconcile",
        "tool_calls",
        ["status", "next_reconcile_at"],
        sqlite_where=_SCHEDULED,
        postgresql_where=_SCHEDULED,
    )


def downgrade() -> None:
    op.drop_index("ix_tool_calls_status_next_reconcile", table_name="tool_calls")
