"""Client ID Metadata Documents kept beside registered clients (issue 12).

A client whose `client_id` is an https URL is known by the document served there; the document as
last fetched is kept in `oauth_clients` with `document_fresh_until`, so every replica uses one fetch
until then. Registered clients leave it NULL.

Revision ID: 0009_clients
Revises: 0008_audit_export
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from store.schema import UTCDateTime

revision = "0009_clients"
down_revision = "0008_audit_export"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("oauth_clients") as batch:
        batch.add_column(sa.Column("document_fresh_until", UTCDateTime, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("oauth_clients") as batch:
        batch.drop_column("document_fresh_until")
