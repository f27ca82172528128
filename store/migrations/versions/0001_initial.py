"""The initial schema: the event log, its head, the projections and the effect ledger.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from store.schema import UTCDateTime

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

GENESIS_HASH = "0" * 64


def upgrade() -> None:
    op.create_table(
        "events",
        sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("event_id", sa.String(64), nullable=False, unique=True),
        sa.Column("type", sa.String(64), nullable=False),
        sa.Column("schema_version", sa.Integer, nullable=False),
        sa.Column("occurred_at", sa.String(32), nullable=False),
        sa.Column("producer", sa.String(128), nullable=False),
        sa.Column("run_id", sa.String(128)),
        sa.Column("tool_call_id", sa.String(128)),
        sa.Column("approval_id", sa.String(128)),
        sa.Column("capability_id", sa.String(256)),
        sa.Column("capability_version", sa.String(64)),
        sa.Column("policy_version", sa.String(128)),
        sa.Column("correlation_id", sa.String(256)),
        sa.Column("causation_id", sa.String(64)),
        sa.Column("tenant", sa.String(128)),
        sa.Column("payload", sa.Text, nullable=False),
        sa.Column("prev_hash", sa.String(64), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
    )
    op.create_index("ix_events_run_id", "events", ["run_id"])
    op.create_index("ix_events_tool_call_id", "events", ["tool_call_id"])
    op.create_index("ix_events_tenant", "events", ["tenant"])

    log_head = op.create_table(
        "log_head",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("last_seq", sa.BigInteger, nullable=False),
        sa.Column("last_hash", sa.String(64), nullable=False),
    )
    op.bulk_insert(log_head, [{"id": 1, "last_seq": 0, "last_hash": GENESIS_HASH}])

    op.create_table(
        "runs",
        sa.Column("run_id", sa.String(128), primary_key=True),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("subject", sa.String(256), nullable=False),
        sa.Column("started_at", UTCDateTime, nullable=False),
        sa.Column("call_count", sa.Integer, nullable=False),
    )

    op.create_table(
        "tool_calls",
        sa.Column("tool_call_id", sa.String(128), primary_key=True),
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("subject", sa.String(256), nullable=False),
        sa.Column("principal", sa.Text, nullable=False),
        sa.Column("tool_name", sa.String(256), nullable=False),
        sa.Column("capability_id", sa.String(256), nullable=False),
        sa.Column("capability_version", sa.String(64), nullable=False),
        sa.Column("action_hash", sa.String(128), nullable=False),
        sa.Column("idempotency_key", sa.String(256), nullable=False),
        sa.Column("key_source", sa.String(16), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("verification_status", sa.String(32), nullable=False),
        sa.Column("decision_effect", sa.String(32), nullable=False),
        sa.Column("reason", sa.String(256)),
        sa.Column("policy_version", sa.String(128), nullable=False),
        sa.Column("arguments", sa.Text, nullable=False),
        sa.Column("summary", sa.Text, nullable=False),
        sa.Column("effect_class", sa.String(32), nullable=False),
        sa.Column("external_request_id", sa.String(256), nullable=False),
        sa.Column("approval_id", sa.String(128)),
        sa.Column("approval_expires_at", UTCDateTime),
        sa.Column("result", sa.Text),
        sa.Column("error", sa.Text),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("dedupe_window_s", sa.Integer, nullable=False),
        sa.Column("correlation_id", sa.String(256)),
        sa.Column("last_event_id", sa.String(64), nullable=False),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.Column("updated_at", UTCDateTime, nullable=False),
        sa.Column("lease_owner", sa.String(128)),
        sa.Column("lease_token", sa.Integer, nullable=False, server_default="0"),
        sa.Column("lease_expires_at", UTCDateTime),
        sa.Column("reconcile_attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("next_reconcile_at", UTCDateTime),
        sa.Column("resolved_by", sa.String(256)),
        sa.Column("confirmation_id", sa.String(128)),
        sa.Column("confirmation_expires_at", UTCDateTime),
    )
    op.create_index("ix_tool_calls_tenant_status", "tool_calls", ["tenant", "status"])
    op.create_index("ix_tool_calls_status_lease", "tool_calls", ["status", "lease_expires_at"])
    op.create_index("ix_tool_calls_run_id", "tool_calls", ["run_id"])
    op.create_index("ix_tool_calls_created_at", "tool_calls", ["created_at"])

    op.create_table(
        "approvals",
        sa.Column("approval_id", sa.String(128), primary_key=True),
        sa.Column("tool_call_id", sa.String(128), nullable=False),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("requester", sa.String(256), nullable=False),
        sa.Column("approver_role", sa.String(128), nullable=False),
        sa.Column("requester_may_approve", sa.Boolean, nullable=False),
        sa.Column("action_hash", sa.String(128), nullable=False),
        sa.Column("expires_at", UTCDateTime, nullable=False),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.Column("decided_by", sa.String(256)),
        sa.Column("decided_at", UTCDateTime),
        sa.Column("reason", sa.Text),
    )
    op.create_index("ix_approvals_tenant_status", "approvals", ["tenant", "status"])

    op.create_table(
        "effect_ledger",
        sa.Column("tenant", sa.String(128), primary_key=True),
        sa.Column("idempotency_key", sa.String(256), primary_key=True),
        sa.Column("tool_call_id", sa.String(128), nullable=False),
        sa.Column("action_hash", sa.String(128), nullable=False),
        sa.Column("key_source", sa.String(16), nullable=False),
        sa.Column("claimed_at", UTCDateTime, nullable=False),
    )

    op.create_table(
        "held_arguments",
        sa.Column("approval_id", sa.String(128), primary_key=True),
        sa.Column("tool_call_id", sa.String(128), nullable=False),
        sa.Column("arguments", sa.Text, nullable=False),
        sa.Column("created_at", UTCDateTime, nullable=False),
    )

    op.create_table(
        "outbox",
        sa.Column("message_id", sa.String(128), primary_key=True),
        sa.Column("topic", sa.String(64), nullable=False),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("approval_id", sa.String(128)),
        sa.Column("tool_call_id", sa.String(128)),
        sa.Column("payload", sa.Text, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("next_attempt_at", UTCDateTime, nullable=False),
        sa.Column("last_error", sa.Text),
        sa.Column("lease_owner", sa.String(128)),
        sa.Column("lease_expires_at", UTCDateTime),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.Column("delivered_at", UTCDateTime),
    )
    op.create_index("ix_outbox_status_next", "outbox", ["status", "next_attempt_at"])

    op.create_table(
        "revocations",
        sa.Column("tenant", sa.String(128), primary_key=True),
        sa.Column("subject", sa.String(256), primary_key=True),
        sa.Column("revoked_at", UTCDateTime, nullable=False),
        sa.Column("revoked_by", sa.String(256), nullable=False),
        sa.Column("reason", sa.Text),
        sa.Column("event_id", sa.String(64), nullable=False),
    )


def downgrade() -> None:
    for index, table in (
        ("ix_outbox_status_next", "outbox"),
        ("ix_approvals_tenant_status", "approvals"),
        ("ix_tool_calls_created_at", "tool_calls"),
        ("ix_tool_calls_status_lease", "tool_calls"),
        ("ix_tool_calls_run_id", "tool_calls"),
        ("ix_tool_calls_tenant_status", "tool_calls"),
        ("ix_events_tenant", "events"),
        ("ix_events_tool_call_id", "events"),
        ("ix_events_run_id", "events"),
    ):
        op.drop_index(index, table_name=table)
    for table in (
        "outbox",
        "held_arguments",
        "revocations",
        "effect_ledger",
        "approvals",
        "tool_calls",
        "runs",
        "log_head",
        "events",
    ):
        op.drop_table(table)
