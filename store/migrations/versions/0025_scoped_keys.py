"""Whether a call's key went to its backend scoped to the principal.

From this revision a backend gets the client's idempotency key scoped to the principal that sent it
(`<key>~<tag>`, store.keys): at a backend every principal's keys share one space, and two agents using
the same key shared one effect there. `tool_call.dispatching` records the key as sent, and the call's
row says which it was, so that its lookups and a re-send to a deduplicating backend use the key the
backend got. One boolean, not a copy of the key: the key sent follows from the row's tenant, subject
and key.

Rows of calls dispatched before read false: their plain key, as their events say. The log is read once
to find the calls it says otherwise of, as `writ store rebuild` would project them: none, unless this
database ran this revision before, was downgraded and is upgraded again (a call whose events were
archived away is not seen: verify against the archive and `writ store rebuild --archive` set it).

Revision ID: 0025_scoped_keys
Revises: 0024_rechecks_by_time
Create Date: 2026-12-05
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

from store.schema import CallId, DigestText, PackedText

revision = "0025_scoped_keys"
down_revision = "0024_rechecks_by_time"
branch_labels = None
depends_on = None

_EVENTS = sa.table(
    "events",
    sa.column("seq", sa.BigInteger),
    sa.column("type", sa.String),
    sa.column("tool_call_id", CallId),
    sa.column("payload", PackedText),
)
_CALLS = sa.table(
    "tool_calls",
    sa.column("tool_call_id", CallId),
    sa.column("idempotency_key", DigestText(256)),
    sa.column("key_scoped", sa.Boolean),
)


def upgrade() -> None:
    # A constant default: SQLite adds the column in place, and PostgreSQL (11+) without rewriting a row.
    with op.batch_alter_table("tool_calls") as batch:
        batch.add_column(sa.Column("key_scoped", sa.Boolean, nullable=False, server_default=sa.false()))
    bind = op.get_bind()
    scoped = _scoped_calls(bind)
    if scoped:
        bind.execute(
            _CALLS.update()
            .where(_CALLS.c.tool_call_id == sa.bindparam("b_tool_call_id", type_=CallId))
            .values(key_scoped=True),
            [{"b_tool_call_id": tool_call_id} for tool_call_id in sorted(scoped)],
        )


def _scoped_calls(bind: sa.Connection) -> set[str]:
    """The calls whose last `tool_call.dispatching` names another key than the call's own."""
    dispatches = (
        sa.select(_EVENTS.c.tool_call_id, _EVENTS.c.payload, _CALLS.c.idempotency_key)
        .join(_CALLS, _CALLS.c.tool_call_id == _EVENTS.c.tool_call_id)
        .where(_EVENTS.c.type == "tool_call.dispatching")
        .order_by(_EVENTS.c.seq)
        .execution_options(yield_per=1000)
    )
    scoped: set[str] = set()
    for tool_call_id, payload, key in bind.execute(dispatches):
        sent = _sent_key(payload)
        if sent is not None and sent != key:
            scoped.add(tool_call_id)
        else:
            scoped.discard(tool_call_id)
    return scoped


def _sent_key(payload: str) -> str | None:
    try:
        sent = json.loads(payload).get("idempotency_key")
    except (ValueError, AttributeError):
        return None  # an unreadable event: verify names it, the migration leaves its call alone
    return sent if isinstance(sent, str) else None


def downgrade() -> None:
    with op.batch_alter_table("tool_calls") as batch:
        batch.drop_column("key_scoped")
