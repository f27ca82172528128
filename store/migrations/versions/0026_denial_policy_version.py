"""A denied call names the policy its denial was made under.

An approved call is authorized again when it runs, under the policy in force then; refused there, its
`tool_call.denied` names that policy (`policy_version` in the envelope, `store.approving.deny`). The
call's row kept the request's version, so `/api/calls/{id}`, `writ_call_status` and the console said it
was denied under the policy that had let it wait for approval. The projection now takes the denial's
version (a denial at request time names the request's, so nothing changes for those); this revision
sets it on the rows written before, from the log, as `writ store rebuild` would project them (a call
whose events were archived away is not seen: `writ store rebuild --archive` sets it). A downgrade puts
back the request's version, as the older projection has it.

Revision ID: 0026_denial_policy_version
Revises: 0025_scoped_keys
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from store.schema import CallId

revision = "0026_denial_policy_version"
down_revision = "0025_scoped_keys"
branch_labels = None
depends_on = None

_EVENTS = sa.table(
    "events",
    sa.column("type", sa.String),
    sa.column("tool_call_id", CallId),
    sa.column("policy_version", sa.String),
)
_CALLS = sa.table(
    "tool_calls",
    sa.column("tool_call_id", CallId),
    sa.column("status", sa.String),
    sa.column("policy_version", sa.String),
)


def upgrade() -> None:
    _set_denied_calls_version_from("tool_call.denied")


def downgrade() -> None:
    _set_denied_calls_version_from("tool_call.requested")


def _set_denied_calls_version_from(event_type: str) -> None:
    """Set each denied call's `policy_version` to the one its `event_type` event names, where it differs."""
    bind = op.get_bind()
    differing = (
        sa.select(_EVENTS.c.tool_call_id, _EVENTS.c.policy_version)
        .join(_CALLS, _CALLS.c.tool_call_id == _EVENTS.c.tool_call_id)
        .where(
            _CALLS.c.status == "denied",
            _EVENTS.c.type == event_type,
            _EVENTS.c.policy_version.is_not(None),
            _EVENTS.c.policy_version != _CALLS.c.policy_version,
        )
    )
    changes = [
        {"b_tool_call_id": tool_call_id, "b_version": version}
        for tool_call_id, version in bind.execute(differing)
    ]
    if changes:
        bind.execute(
            _CALLS.update()
            .where(_CALLS.c.tool_call_id == sa.bindparam("b_tool_call_id", type_=CallId))
            .values(policy_version=sa.bindparam("b_version")),
            changes,
        )
