"""The authorization server's clients, grant families, codes and refresh tokens (issue 12).

Not projections: nothing of it is in the log, so a rebuild leaves these tables alone.

Revision ID: 0006_oauth
Revises: 0005_budgets
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from store.schema import UTCDateTime

revision = "0006_oauth"
down_revision = "0005_budgets"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "oauth_clients",
        sa.Column("client_id", sa.String(128), primary_key=True),
        sa.Column("secret_hash", sa.String(64)),
        sa.Column("metadata", sa.Text, nullable=False),
        sa.Column("issued_at", UTCDateTime, nullable=False),
    )
    op.create_table(
        "oauth_families",
        sa.Column("family_id", sa.String(64), primary_key=True),
        sa.Column("client_id", sa.String(128), nullable=False),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("subject", sa.String(256), nullable=False),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.Column("revoked_at", UTCDateTime),
        sa.Column("revoked_reason", sa.String(64)),
    )
    op.create_index("ix_oauth_families_principal", "oauth_families", ["tenant", "subject"])
    op.create_table(
        "oauth_codes",
        sa.Column("code_hash", sa.String(64), primary_key=True),
        sa.Column("family_id", sa.String(64), nullable=False),
        sa.Column("client_id", sa.String(128), nullable=False),
        sa.Column("redirect_uri", sa.Text, nullable=False),
        sa.Column("scope", sa.Text, nullable=False),
        sa.Column("resource", sa.Text, nullable=False),
        sa.Column("code_challenge", sa.String(128), nullable=False),
        sa.Column("code_challenge_method", sa.String(16), nullable=False),
        sa.Column("grantee", sa.Text, nullable=False),
        sa.Column("expires_at", UTCDateTime, nullable=False),
        sa.Column("used_at", UTCDateTime),
    )
    op.create_table(
        "oauth_refresh_tokens",
        sa.Column("token_hash", sa.String(64), primary_key=True),
        sa.Column("family_id", sa.String(64), nullable=False),
        sa.Column("client_id", sa.String(128), nullable=False),
        sa.Column("scope", sa.Text, nullable=False),
        sa.Column("resource", sa.Text, nullable=False),
        sa.Column("grantee", sa.Text, nullable=False),
        sa.Column("issued_at", UTCDateTime, nullable=False),
        sa.Column("expires_at", UTCDateTime, nullable=False),
        sa.Column("used_at", UTCDateTime),
    )
    op.create_index("ix_oauth_codes_expires_at", "oauth_codes", ["expires_at"])
    op.create_index("ix_oauth_refresh_tokens_expires_at", "oauth_refresh_tokens", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_oauth_refresh_tokens_expires_at", "oauth_refresh_tokens")
    op.drop_index("ix_oauth_codes_expires_at", "oauth_codes")
    op.drop_table("oauth_refresh_tokens")
    op.drop_table("oauth_codes")
    op.drop_index("ix_oauth_families_principal", "oauth_families")
    op.drop_table("oauth_families")
    op.drop_table("oauth_clients")
