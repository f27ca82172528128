"""Reading projection rows back as the store's frozen view dataclasses."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Connection, Row, bindparam, select

from store.keys import scoped_key
from store.model import ApprovalView, CallView, PrincipalRecord
from store.raw import Record
from store.schema import approvals, events, read_correlation, tool_calls

# Built once, not per read: SQLAlchemy caches the compiled form by the statement's key.
CALL_BY_ID = select(tool_calls).where(tool_calls.c.tool_call_id == bindparam("b_tool_call_id"))
_CALL_BY_ID_IN_TENANT = CALL_BY_ID.where(tool_calls.c.tenant == bindparam("b_tenant"))
_APPROVAL_BY_ID = select(approvals).where(approvals.c.approval_id == bindparam("b_approval_id"))
_APPROVAL_BY_ID_IN_TENANT = _APPROVAL_BY_ID.where(approvals.c.tenant == bindparam("b_tenant"))


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def call_view(row: Record) -> CallView:
    return CallView(
        tool_call_id=row.tool_call_id,
        run_id=row.run_id,
        tenant=row.tenant,
        subject=row.subject,
        tool_name=row.tool_name,
        capability_id=row.capability_id,
        capability_version=row.capability_version,
        action_hash=row.action_hash,
        idempotency_key=row.idempotency_key,
        key_source=row.key_source,
        status=row.status,
        verification_status=row.verification_status,
        decision_effect=row.decision_effect,
        reason=row.reason,
        policy_version=row.policy_version,
        arguments=_loads(row.arguments),
        summary=row.summary,
        external_request_id=row.external_request_id,
        approval_id=row.approval_id,
        approval_expires_at=row.approval_expires_at,
        result=_loads(row.result),
        error=row.error,
        created_at=row.created_at,
        updated_at=row.updated_at,
        dedupe_window_s=row.dedupe_window_s,
        attempts=row.attempts,
        effect_class=row.effect_class,
        correlation_id=read_correlation(row.correlation_id, row.tool_call_id),
        principal=PrincipalRecord.from_json(recorded) if (recorded := _loads(row.principal)) else None,
        lease_owner=row.lease_owner,
        lease_token=row.lease_token,
        lease_expires_at=row.lease_expires_at,
        reconcile_attempts=row.reconcile_attempts,
        next_reconcile_at=row.next_reconcile_at,
        resolved_by=row.resolved_by,
        confirmation_id=row.confirmation_id,
        confirmation_expires_at=row.confirmation_expires_at,
        contract_hash=row.contract_hash,
        key_scoped=bool(row.key_scoped),
    )


def approval_view(row: Row[Any]) -> ApprovalView:
    return ApprovalView(
        approval_id=row.approval_id,
        tool_call_id=row.tool_call_id,
        tenant=row.tenant,
        status=row.status,
        requester=row.requester,
        approver_role=row.approver_role,
        requester_may_approve=bool(row.requester_may_approve),
        action_hash=row.action_hash,
        expires_at=row.expires_at,
        created_at=row.created_at,
        decided_by=row.decided_by,
        decided_at=row.decided_at,
        reason=row.reason,
    )


def load_call(conn: Connection, tool_call_id: str, tenant: str | None = None) -> CallView | None:
    if tenant is None:
        row = conn.execute(CALL_BY_ID, {"b_tool_call_id": tool_call_id}).one_or_none()
    else:
        params = {"b_tool_call_id": tool_call_id, "b_tenant": tenant}
        row = conn.execute(_CALL_BY_ID_IN_TENANT, params).one_or_none()
    return None if row is None else call_view(row)


def load_approval(conn: Connection, approval_id: str, tenant: str | None = None) -> ApprovalView | None:
    if tenant is None:
        row = conn.execute(_APPROVAL_BY_ID, {"b_approval_id": approval_id}).one_or_none()
    else:
        params = {"b_approval_id": approval_id, "b_tenant": tenant}
        row = conn.execute(_APPROVAL_BY_ID_IN_TENANT, params).one_or_none()
    return None if row is None else approval_view(row)


_SUPERSEDED = select(events.c.payload).where(
    events.c.tool_call_id == bindparam("b_call"), events.c.type == "tool_call.requested"
)


def first_sent_key(tenant: str, subject: str, key: str, superseded: CallView | None) -> str:
    """The key a call's first dispatch sends: `key` scoped to the principal (store.keys), unless the
    call took `key` over from `superseded`, a call whose backend got it plain, dispatched before keys
    were scoped. That backend knows the effect by the plain key: a deduplicating one drops a second
    request under it (a same-key `writ calls retry`, or a client's re-send after a `failed` that was
    wrong), where under the scoped key it would act again."""
    if superseded is not None and superseded.attempts > 0 and not superseded.key_scoped:
        return key
    return scoped_key(tenant, subject, key)


def first_sent_key_of(conn: Connection, tenant: str, subject: str, key: str, tool_call_id: str) -> str:
    """`first_sent_key` for a call admitted earlier (approved or confirmed since), as its
    `tool_call.requested` names the call it took its key over from."""
    text = conn.execute(_SUPERSEDED, {"b_call": tool_call_id}).scalar_one_or_none()
    supersedes = json.loads(text).get("supersedes") if text is not None else None
    superseded = load_call(conn, supersedes) if supersedes is not None else None
    return first_sent_key(tenant, subject, key, superseded)
