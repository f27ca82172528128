"""Events by tenant in seq order, for the audit export (issue 14).

The export pages one tenant's events after a cursor (`WHERE tenant = ? AND seq > ? ORDER BY seq`). On
`tenant` alone, PostgreSQL read every event of the tenant and sorted them for each page; on `(tenant,
seq)` a page reads only its own rows. The index on `tenant` alone is dropped: the new one serves its
lookups, and each index costs every append.

Revision ID: 0008_audit_export
Revises: 0007_loops
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

revision = "0008_audit_export"
down_revision = "0007_loops"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_events_tenant_seq", "events", ["tenant", "seq"])
    op.drop_index("ix_events_tenant", table_name="events")


def downgrade() -> None:
    op.create_index("ix_events_tenant", "events", ["tenant"])
    op.drop_index("ix_events_tenant_seq", table_name="events")
