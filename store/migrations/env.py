"""Alembic environment: runs on the connection `Store.migrate` hands over, never from an ini file."""

from __future__ import annotations

from alembic import context

from store.schema import metadata

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through Store.migrate(), which passes the connection")

context.configure(connection=connection, target_metadata=metadata, compare_type=True)
with context.begin_transaction():
    context.run_migrations()
