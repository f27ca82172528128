"""The run_id indexes of `events` and `tool_calls` hold only rows in a run (issue 16 item 8).

A stateless client's call names no run, and every one of its events and its call row still put an
entry for NULL in these indexes (on a read through the gateway, about 48 bytes on SQLite and 96 on
PostgreSQL per call) that no query reads: every lookup is `run_id = :id`, which a partial index
`WHERE run_id IS NOT NULL` serves as before (both databases prove the condition from the equality).

Revision ID: 0017_run_indexes_in_runs
Revises: 0016_short_digests
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017_run_indexes_in_runs"
down_revision = "0016_short_digests"
branch_labels = None
depends_on = None

_INDEXES = (("ix_events_run_id", "events"), ("ix_tool_calls_run_id", "tool_calls"))
_IN_A_RUN = sa.text("run_id IS NOT NULL")


def upgrade() -> None:
    for name, table in _INDEXES:
        op.drop_index(name, table_name=table)
        op.create_index(name, table, ["run_id"], sqlite_where=_IN_A_RUN, postgresql_where=_IN_A_RUN)


def downgrade() -> None:
    for name, table in _INDEXES:
        op.drop_index(name, table_name=table)
        op.create_index(name, table, ["run_id"])
