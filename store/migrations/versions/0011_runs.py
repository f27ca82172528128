"""Runs that Writ owns (issue 13): a run's origin and standing, and calls that belong to no run.

A call whose client names no run is grouped by its MCP session where the protocol has one, and is in
no run where it has none (2026-07-28): `tool_calls.run_id` may be empty. A run can be stopped and
resumed (`run.stopped`, `run.resumed`): `status` is what admission reads under the head lock. Rows of
runs written before are `active` with no origin, which is what a rebuild of their `run.started` gives.

Revision ID: 0011_runs
Revises: 0010_idtokens
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from store.schema import UTCDateTime

revision = "0011_runs"
down_revision = "0010_idtokens"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("origin", sa.String(16), nullable=True))
        batch.add_column(sa.Column("status", sa.String(16), nullable=False, server_default="active"))
        batch.add_column(sa.Column("stopped_at", UTCDateTime, nullable=True))
        batch.add_column(sa.Column("stopped_by", sa.String(256), nullable=True))
        batch.add_column(sa.Column("stop_reason", sa.Text, nullable=True))
    op.create_index("ix_runs_tenant_started_at", "runs", ["tenant", "started_at"])
    with op.batch_alter_table("tool_calls") as batch:
        batch.alter_column("run_id", existing_type=sa.String(128), nullable=True)


def downgrade() -> None:
    # A call in no run gets the empty run id: the older schema had no way to say "none".
    op.execute("UPDATE tool_calls SET run_id = '' WHERE run_id IS NULL")
    with op.batch_alter_table("tool_calls") as batch:
        batch.alter_column("run_id", existing_type=sa.String(128), nullable=False)
    op.drop_index("ix_runs_tenant_started_at", table_name="runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("stop_reason")
        batch.drop_column("stopped_by")
        batch.drop_column("stopped_at")
        batch.drop_column("status")
        batch.drop_column("origin")
