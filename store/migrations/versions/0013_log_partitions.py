"""Partitions of the log (issue 16 item 7): one head row, pseq and hash chain per partition.

Today's single chain becomes partition "" unchanged: each event's `pseq` is its `seq`, and the head row
keeps its last seq and hash under the key "". Nothing is re-hashed, so `writ audit verify` and the
checkpoints made before still hold. `events_seq` (PostgreSQL) hands out global seqs once the store is
configured with several partitions; it starts past the last seq when a store first appends that way.

Revision ID: 0013_log_partitions
Revises: 0012_compact_store
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013_log_partitions"
down_revision = "0012_compact_store"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("events") as batch:
        batch.add_column(sa.Column("partition", sa.String(160), nullable=False, server_default=""))
        batch.add_column(sa.Column("pseq", sa.BigInteger, nullable=True))
    op.execute("UPDATE events SET pseq = seq")
    with op.batch_alter_table("events") as batch:
        batch.alter_column("pseq", existing_type=sa.BigInteger, nullable=False)
    op.create_index("ux_events_partition_pseq", "events", ["partition", "pseq"], unique=True)
    with op.batch_alter_table("log_head", recreate="always") as batch:
        batch.add_column(sa.Column("partition", sa.String(160), nullable=False, server_default=""))
    with op.batch_alter_table("log_head", recreate="always") as batch:
        batch.drop_column("id")
        batch.create_primary_key("log_head_pkey", ["partition"])
        batch.alter_column("partition", existing_type=sa.String(160), server_default=None)
    if op.get_context().dialect.name == "postgresql":
        op.execute(sa.schema.CreateSequence(sa.Sequence("events_seq")))


def downgrade() -> None:
    bind = op.get_bind()
    others = bind.execute(sa.text("SELECT count(*) FROM log_head WHERE partition <> ''")).scalar()
    if others:
        raise RuntimeError("the log has several partitions: an unpartitioned schema cannot hold them")
    if op.get_context().dialect.name == "postgresql":
        op.execute(sa.schema.DropSequence(sa.Sequence("events_seq")))
    with op.batch_alter_table("log_head", recreate="always") as batch:
        batch.add_column(sa.Column("id", sa.Integer, nullable=False, server_default="1"))
    with op.batch_alter_table("log_head", recreate="always") as batch:
        batch.drop_constraint("log_head_pkey", type_="primary")
        batch.drop_column("partition")
        batch.create_primary_key("log_head_pkey", ["id"])
        batch.alter_column("id", existing_type=sa.Integer, server_default=None)
    op.drop_index("ux_events_partition_pseq", table_name="events")
    with op.batch_alter_table("events") as batch:
        batch.drop_column("pseq")
        batch.drop_column("partition")
