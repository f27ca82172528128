"""The web console's sign-in sessions, shared by every replica (store.console_sessions).

The console's cookie held the bearer token itself: logging out could not end it, and a server on
another port of the host could read it and use it on /mcp and /api. The cookie now holds a random
session id whose sha256 is kept here. Not a projection: nothing of it is in the log, and a rebuild
leaves the table alone. A session opened by an earlier revision's cookie (a bearer token) names no row
here, so its holder logs in again once.

Revision ID: 0023_console_sessions
Revises: 0022_short_call_ids
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from store.schema import UTCDateTime

revision = "0023_console_sessions"
down_revision = "0022_short_call_ids"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "console_sessions",
        # 32 bytes: BLOB on SQLite, bytea on PostgreSQL (store.schema.HexDigest).
        sa.Column("session_hash", sa.LargeBinary(32), primary_key=True),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("subject", sa.String(256), nullable=False),
        sa.Column("principal", sa.Text, nullable=False),
        sa.Column("grant_family", sa.String(64)),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.Column("expires_at", UTCDateTime, nullable=False),
    )
    op.create_index("ix_console_sessions_principal", "console_sessions", ["tenant", "subject"])
    op.create_index("ix_console_sessions_expires_at", "console_sessions", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_console_sessions_expires_at", "console_sessions")
    op.drop_index("ix_console_sessions_principal", "console_sessions")
    op.drop_table("console_sessions")
