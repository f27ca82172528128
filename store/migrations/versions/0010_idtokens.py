"""OpenID Connect ID tokens from Writ's authorization server (issue 12).

A code keeps the authorization request's `nonce` (echoed in the ID token; a nonce a client used before
is refused) and when the user signed in (`auth_time`), which every refresh token of the family carries
on for the ID tokens of refreshes. Rows from before have neither: their ID tokens omit them.

Revision ID: 0010_idtokens
Revises: 0009_clients
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from store.schema import UTCDateTime

revision = "0010_idtokens"
down_revision = "0009_clients"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("oauth_codes") as batch:
        batch.add_column(sa.Column("nonce", sa.Text, nullable=True))
        batch.add_column(sa.Column("auth_time", UTCDateTime, nullable=True))
    op.create_index("ix_oauth_codes_client_nonce", "oauth_codes", ["client_id", "nonce"])
    with op.batch_alter_table("oauth_refresh_tokens") as batch:
        batch.add_column(sa.Column("auth_time", UTCDateTime, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("oauth_refresh_tokens") as batch:
        batch.drop_column("auth_time")
    op.drop_index("ix_oauth_codes_client_nonce", "oauth_codes")
    with op.batch_alter_table("oauth_codes") as batch:
        batch.drop_column("auth_time")
        batch.drop_column("nonce")
