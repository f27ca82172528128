"""What waits beside an approval: the held full arguments and the transactional outbox of notifications.

Neither is a projection. Both are written in the transaction that records `approval.required`, so an
approval never exists without the arguments it will dispatch or the notification that announces it.
Outbox claims are compare-and-set leases (`FOR UPDATE SKIP LOCKED` on PostgreSQL), so any number of
replicas may deliver; delivery is at least once, and each message carries its id for receivers to
deduplicate.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import Connection, Row, delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from store.canonical import canonical_json
from store.commands import ClaimOutbox, EnqueueOutbox, OutboxDelivered, OutboxFailed
from store.model import ApprovalView, CallRequest, OutboxMessage
from store.schema import approvals, held_arguments, outbox
from store.views import approval_view

T = TypeVar("T")

TOPIC_APPROVAL_REQUIRED = "approval.required"
TOPIC_CHECKPOINT = "audit.checkpoint"


def on_admitted(conn: Connection, req: CallRequest) -> None:
    """Inside `admit`'s transaction: hold the arguments and queue the notification of a new approval."""
    if req.approval_id is None or req.decision.effect != "require_approval":
        return
    if req.held_arguments is not None:
        conn.execute(
            insert(held_arguments).values(
                approval_id=req.approval_id,
                tool_call_id=req.identity.tool_call_id,
                arguments=canonical_json(dict(req.held_arguments)),
                created_at=req.identity.now,
            )
        )
    if req.notification is not None:
        conn.execute(
            insert(outbox).values(
                message_id=f"msg_{req.approval_id}",
                topic=TOPIC_APPROVAL_REQUIRED,
                tenant=req.identity.tenant,
                approval_id=req.approval_id,
                tool_call_id=req.identity.tool_call_id,
                payload=canonical_json(dict(req.notification)),
                status="pending",
                attempts=0,
                next_attempt_at=req.identity.now,
                created_at=req.identity.now,
            )
        )


def release(conn: Connection, approval_id: str | None) -> None:
    """Forget the held arguments of an approval whose call will never be dispatched from them."""
    if approval_id is not None:
        conn.execute(delete(held_arguments).where(held_arguments.c.approval_id == approval_id))


def message_of(row: Row[Any]) -> OutboxMessage:
    return OutboxMessage(
        message_id=row.message_id,
        topic=row.topic,
        tenant=row.tenant,
        approval_id=row.approval_id,
        tool_call_id=row.tool_call_id,
        payload=json.loads(row.payload),
        status=row.status,
        attempts=row.attempts,
        next_attempt_at=row.next_attempt_at,
        created_at=row.created_at,
        last_error=row.last_error,
        delivered_at=row.delivered_at,
        lease_owner=row.lease_owner,
    )


def expired_approval(now: Any) -> tuple[Any, ...]:
    """Approvals still awaiting a decision past their expiry at `now` (a datetime, or a bound parameter)."""
    return (approvals.c.status == "awaiting_approval", approvals.c.expires_at <= now)


class Queues:
    """Mixed into `Store`, which provides `_write` (one write transaction) and `_read`."""

    def _write(self, now: datetime, work: Callable[[Connection], T]) -> T:
        raise NotImplementedError

    def _read(self) -> AbstractContextManager[Connection]:
        raise NotImplementedError

    # -- held arguments -------------------------------------------------------------------------

    def held_arguments(self, approval_id: str) -> Mapping[str, Any] | None:
        """The full arguments held for an approval's call, or None once released (or never held)."""
        query = select(held_arguments.c.arguments).where(held_arguments.c.approval_id == approval_id)
        with self._read() as conn:
            text = conn.execute(query).scalar_one_or_none()
        return None if text is None else json.loads(text)

    def release_held_arguments(self, approval_id: str, *, now: datetime) -> None:
        """Forget the held arguments once the approved call has settled."""
        self._write(now, lambda conn: release(conn, approval_id))

    # -- approvals due to expire ----------------------------------------------------------------

    def due_approvals(self, *, now: datetime, limit: int = 100) -> list[ApprovalView]:
        """Approvals still awaiting a decision whose expiry has passed, oldest expiry first."""
        query = select(approvals).where(*expired_approval(now)).order_by(approvals.c.expires_at).limit(limit)
        with self._read() as conn:
            return [approval_view(row) for row in conn.execute(query)]

    # -- outbox ---------------------------------------------------------------------------------

    def outbox_messages(self, *, status: str | None = None, limit: int = 100) -> list[OutboxMessage]:
        """Outbox messages newest first, optionally of one status (`pending`, `delivered`, `dead`)."""
        query = select(outbox).order_by(outbox.c.created_at.desc(), outbox.c.message_id).limit(limit)
        if status is not None:
            query = query.where(outbox.c.status == status)
        with self._read() as conn:
            return [message_of(row) for row in conn.execute(query)]

    def enqueue_outbox(self, cmd: EnqueueOutbox) -> bool:
        """Queue a message announcing no call; False if one with its id is queued already."""

        def work(conn: Connection) -> bool:
            try:
                with conn.begin_nested():
                    conn.execute(
                        insert(outbox).values(
                            message_id=cmd.message_id,
                            topic=cmd.topic,
                            tenant=cmd.tenant,
                            payload=canonical_json(dict(cmd.payload)),
                            status="pending",
                            attempts=0,
                            next_attempt_at=cmd.now,
                            created_at=cmd.now,
                        )
                    )
            except IntegrityError:
                return False
            return True

        return self._write(cmd.now, work)

    def claim_outbox(self, cmd: ClaimOutbox) -> list[OutboxMessage]:
        """Lease due pending messages to `owner`; each claim counts as one delivery attempt."""
        now = cmd.now

        def work(conn: Connection) -> list[OutboxMessage]:
            # SKIP LOCKED: replicas claiming at once take disjoint messages (SQLite has one writer).
            due = (
                select(outbox.c.message_id)
                .where(
                    outbox.c.status == "pending",
                    outbox.c.next_attempt_at <= now,
                    (outbox.c.lease_expires_at.is_(None)) | (outbox.c.lease_expires_at < now),
                )
                .order_by(outbox.c.next_attempt_at)
                .limit(cmd.limit)
                .with_for_update(skip_locked=True)
            )
            if cmd.topics:  # each webhook claims its own messages only
                due = due.where(outbox.c.topic.in_(cmd.topics))
            ids = list(conn.execute(due).scalars())
            if not ids:
                return []
            conn.execute(
                update(outbox)
                .where(outbox.c.message_id.in_(ids))
                .values(
                    lease_owner=cmd.owner,
                    lease_expires_at=now + timedelta(seconds=cmd.lease_s),
                    attempts=outbox.c.attempts + 1,
                )
            )
            rows = conn.execute(select(outbox).where(outbox.c.message_id.in_(ids))).all()
            return [message_of(row) for row in rows]

        return self._write(now, work)

    def outbox_delivered(self, cmd: OutboxDelivered) -> bool:
        """Mark a message this owner holds as delivered; False if its lease was lost meanwhile."""
        return self._settle_outbox(
            cmd.message_id, cmd.owner, cmd.now, status="delivered", delivered_at=cmd.now, last_error=None
        )

    def outbox_failed(self, cmd: OutboxFailed) -> bool:
        """Record a failed attempt: retry at `retry_at`, or give up (`dead`) when it is None."""
        if cmd.retry_at is None:
            return self._settle_outbox(
                cmd.message_id, cmd.owner, cmd.now, status="dead", last_error=cmd.error
            )
        return self._settle_outbox(
            cmd.message_id,
            cmd.owner,
            cmd.now,
            status="pending",
            next_attempt_at=cmd.retry_at,
            last_error=cmd.error,
        )

    def _settle_outbox(self, message_id: str, owner: str, now: datetime, **values: Any) -> bool:
        statement = (
            update(outbox)
            .where(
                outbox.c.message_id == message_id,
                outbox.c.lease_owner == owner,
                outbox.c.status == "pending",
            )
            .values(lease_owner=None, lease_expires_at=None, **values)
        )
        return bool(self._write(now, lambda conn: conn.execute(statement).rowcount))
