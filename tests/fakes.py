"""Small in-memory fakes of the store's ports, for unit tests of gateway logic that needs no SQL.

Each keeps the refusals the SQL store makes (NotFound, StaleLease, StoreError) that the gateway
translates, remembers the commands it was given, and does nothing else: the store suite, run on SQLite
and PostgreSQL, is the contract these stand in for. mypy checks that each one satisfies its port
(`_conforms` below; tests.fakes is in pyproject's [tool.mypy] modules).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from datetime import datetime

from store.agenda import Due
from store.commands import (
    ClaimOutbox,
    DecideApproval,
    ExpireApproval,
    OutboxDelivered,
    OutboxFailed,
    ResolveManually,
    RestorePrincipal,
    RevokePrincipal,
)
from store.console_sessions import ConsoleSession, session_digest
from store.model import ApprovalView, CallView, NotFound, OutboxMessage, StaleLease, StoreError
from store.ports import Agenda, Approvals, ConsoleSessions, ManualResolutions, Outbox, Revocations, Standing
from store.revoking import Revocation


class FakeAgenda:
    """The `Agenda` port: answers what `due` says, and remembers when it was asked."""

    def __init__(self, due: Due | None = None) -> None:
        self.due = due or Due()
        self.looks: list[datetime] = []

    async def due_work_async(self, *, now: datetime) -> Due:
        self.looks.append(now)
        return self.due


class FakeApprovals:
    """The `Approvals` port over a dict of approvals, deciding and expiring as the store does."""

    def __init__(
        self, approvals: Iterable[ApprovalView] = (), retried_by: dict[str, str] | None = None
    ) -> None:
        """`retried_by`: who asked for each call (by id) that is a retry of a failed call."""
        self.approvals = {a.approval_id: a for a in approvals}
        self.retried_by = dict(retried_by or {})
        self.decided: list[DecideApproval] = []
        self.expired: list[ExpireApproval] = []

    def get_approval(self, approval_id: str, *, tenant: str | None = None) -> ApprovalView | None:
        approval = self.approvals.get(approval_id)
        if approval is None or (tenant is not None and approval.tenant != tenant):
            return None
        return approval

    def decide_approval(self, cmd: DecideApproval) -> ApprovalView:
        approval = self._awaiting(cmd.approval_id, cmd.tenant)
        if cmd.now >= approval.expires_at:
            raise StaleLease(f"approval {cmd.approval_id} expired")
        askers = (approval.requester, self.retried_by.get(approval.tool_call_id))
        if cmd.approve and not approval.requester_may_approve and cmd.decided_by in askers:
            raise StoreError(f"{cmd.decided_by} may not approve their own call or retry")
        self.decided.append(cmd)
        return self._set(
            dataclasses.replace(
                approval,
                status="approved" if cmd.approve else "rejected",
                decided_by=cmd.decided_by,
                decided_at=cmd.now,
                reason=cmd.reason,
            )
        )

    def retry_requested_by(self, tool_call_id: str) -> str | None:
        return self.retried_by.get(tool_call_id)

    def expire_approval(self, cmd: ExpireApproval) -> ApprovalView:
        approval = self._awaiting(cmd.approval_id, None)
        if cmd.now < approval.expires_at:
            raise StaleLease(f"approval {cmd.approval_id} is not yet due")
        self.expired.append(cmd)
        return self._set(dataclasses.replace(approval, status="expired"))

    def _awaiting(self, approval_id: str, tenant: str | None) -> ApprovalView:
        approval = self.get_approval(approval_id, tenant=tenant)
        if approval is None:
            raise NotFound(f"no approval {approval_id}")
        if approval.status != "awaiting_approval":
            raise StaleLease(f"approval {approval_id} is already {approval.status}")
        return approval

    def _set(self, changed: ApprovalView) -> ApprovalView:
        self.approvals[changed.approval_id] = changed
        return changed


class FakeResolutions:
    """The `ManualResolutions` port over a dict of calls: settles an unknown one, refuses the rest."""

    def __init__(self, calls: Iterable[CallView] = ()) -> None:
        self.calls = {c.tool_call_id: c for c in calls}
        self.resolved: list[ResolveManually] = []

    def get_call(self, tool_call_id: str, *, tenant: str | None = None) -> CallView | None:
        call = self.calls.get(tool_call_id)
        return None if call is None or (tenant is not None and call.tenant != tenant) else call

    def resolve_manually(self, cmd: ResolveManually) -> CallView:
        call = self.calls.get(cmd.tool_call_id)
        if call is None or (cmd.tenant is not None and call.tenant != cmd.tenant):
            raise NotFound(f"no tool call {cmd.tool_call_id}")
        if not call.unresolved:
            raise StaleLease(f"call {cmd.tool_call_id} is {call.status}: nothing unknown to settle")
        self.resolved.append(cmd)
        settled = dataclasses.replace(
            call,
            status="completed" if cmd.succeeded else "failed",
            verification_status="confirmed_success" if cmd.succeeded else "confirmed_failure",
            resolved_by=cmd.by,
        )
        self.calls[call.tool_call_id] = settled
        return settled


class FakeOutbox:
    """The `Outbox` port over a list of messages: claims the pending ones, remembers what was said."""

    def __init__(self, messages: Iterable[OutboxMessage] = ()) -> None:
        self.messages = list(messages)
        self.delivered: list[OutboxDelivered] = []
        self.failed: list[OutboxFailed] = []

    def claim_outbox(self, cmd: ClaimOutbox) -> list[OutboxMessage]:
        due = [
            m
            for m in self.messages
            if m.status == "pending"
            and m.next_attempt_at <= cmd.now
            and (not cmd.topics or m.topic in cmd.topics)
        ]
        return due[: cmd.limit]

    def outbox_delivered(self, cmd: OutboxDelivered) -> bool:
        self.delivered.append(cmd)
        return True

    def outbox_failed(self, cmd: OutboxFailed) -> bool:
        self.failed.append(cmd)
        return True


class FakeRevocations:
    """The `Revocations` (and `Standing`) port over a dict of revoked (tenant, subject) pairs."""

    def __init__(self) -> None:
        self.revocations: dict[tuple[str, str], Revocation] = {}

    def is_revoked(self, tenant: str, subject: str) -> bool:
        return (tenant, subject) in self.revocations

    def revoke_principal(self, cmd: RevokePrincipal) -> Revocation:
        revocation = Revocation(cmd.tenant, cmd.subject, cmd.now, cmd.revoked_by, cmd.reason)
        return self.revocations.setdefault((cmd.tenant, cmd.subject), revocation)

    def restore_principal(self, cmd: RestorePrincipal) -> Revocation:
        lifted = self.revocations.pop((cmd.tenant, cmd.subject), None)
        if lifted is None:
            raise NotFound(f"{cmd.subject} is not revoked in tenant {cmd.tenant}")
        return lifted


class FakeConsoleSessions:
    """Console sessions by the digest of their id, as the store keeps them; an expired one is not found."""

    def __init__(self) -> None:
        self.sessions: dict[str, ConsoleSession] = {}

    def open_console_session(self, session_id: str, session: ConsoleSession) -> None:
        if session.expires_at <= session.created_at:
            raise ValueError("a console session must end after it begins")
        if session_digest(session_id) in self.sessions:
            raise StoreError("write refused by a database constraint: session_hash")
        self.sessions[session_digest(session_id)] = session

    def console_session(self, session_id: str, *, now: datetime) -> ConsoleSession | None:
        found = self.sessions.get(session_digest(session_id))
        return found if found is not None and found.expires_at > now else None

    def end_console_session(self, session_id: str, *, now: datetime) -> bool:
        return self.sessions.pop(session_digest(session_id), None) is not None


def _conforms(
    approvals: FakeApprovals,
    resolutions: FakeResolutions,
    outbox: FakeOutbox,
    standing: FakeRevocations,
    agenda: FakeAgenda,
    sessions: FakeConsoleSessions,
) -> tuple[Approvals, ManualResolutions, Outbox, Revocations, Standing, Agenda, ConsoleSessions]:
    """Never called: mypy fails here when a fake drifts from its port."""
    return approvals, resolutions, outbox, standing, standing, agenda, sessions
