"""Approvals found by status and expiry: the passes' look and the expiry worker ask every second.

Every replica asks, once a second, whether an approval still awaiting a decision is past its expiry
(store.agenda, `due_approvals`). The only index on `approvals` led with `tenant`, so each of those asks
read every approval ever made, a table that only grows. `(status, expires_at)` answers it from the
few approvals still waiting.

Revision ID: 0020_approvals_by_expiry
Revises: 0019_compact_call_times
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

revision = "0020_approvals_by_expiry"
down_revision = "0019_compact_call_times"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_approvals_status_expires_at", "approvals", ["status", "expires_at"])


def downgrade() -> None:
    op.drop_index("ix_approvals_status_expires_at", table_name="approvals")
