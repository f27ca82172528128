"""The store as each gateway component sees it: narrow ports, all implemented by the one SQL `Store`.

A component takes the port it needs, not the whole store, so its signature says which facts it reads
and writes, and a unit test can hand it a small fake. `Store` satisfies every port structurally (mypy
checks it where the composition root hands the store in).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from store.agenda import Due
from store.coming import Coming
from store.commands import (
    ClaimOutbox,
    DecideApproval,
    EscalateReconciliation,
    ExpireApproval,
    OutboxDelivered,
    OutboxFailed,
    RecordContradiction,
    RecordInconclusive,
    RecordOutcome,
    RecordRecheck,
    Redispatch,
    ResolveManually,
    ResolveReconciliation,
    RestorePrincipal,
    ResumeRun,
    RevokePrincipal,
    StartReconciliation,
    StopRun,
)
from store.console_sessions import ConsoleSession
from store.exporting import EventFilter
from store.model import (
    Admission,
    Anchor,
    ApprovalView,
    ApprovedDenial,
    ApprovedDispatch,
    AuditReport,
    CallRequest,
    CallView,
    ConfirmationAnswer,
    OutboxMessage,
    ReadRecord,
    RefusalRequest,
    RunView,
    StoredEvent,
)
from store.oauth import CodeGrant, RefreshGrant, RegisteredClient
from store.oauth_clients import ClientDetail, ClientRevocation, ClientSummary, RevokeClient
from store.revoking import Revocation
from store.security import SecurityNote


class Standing(Protocol):
    """Whether a principal's standing in a tenant has been revoked."""

    def is_revoked(self, tenant: str, subject: str) -> bool: ...


class CallReads(Protocol):
    """The projections of calls and approvals, as the faces show them."""

    def get_call(self, tool_call_id: str, *, tenant: str | None = None) -> CallView | None: ...

    def get_approval(self, approval_id: str, *, tenant: str | None = None) -> ApprovalView | None: ...

    def list_calls(
        self,
        *,
        tenant: str | None = None,
        status: str | None = None,
        unresolved: bool = False,
        limit: int = 100,
    ) -> list[CallView]: ...

    def retry_requested_by(self, tool_call_id: str) -> str | None: ...

    def list_approvals(
        self, *, tenant: str | None = None, status: str | None = None
    ) -> list[ApprovalView]: ...

    def events(
        self,
        *,
        run_id: str | None = None,
        tool_call_id: str | None = None,
        tenant: str | None = None,
        after_seq: int = 0,
        limit: int | None = None,
    ) -> list[StoredEvent]: ...


class Contradictions(Protocol):
    """Evidence that contradicts a settled verdict: recorded and escalated, never overwritten."""

    def record_contradiction(self, cmd: RecordContradiction) -> CallView | None: ...


class Outcomes(Contradictions, Protocol):
    """What the dispatcher records: the outcome an executor reported, under the lease's fencing token."""

    def get_call(self, tool_call_id: str, *, tenant: str | None = None) -> CallView | None: ...

    def record_outcome(self, cmd: RecordOutcome) -> CallView: ...

    async def record_outcome_async(self, cmd: RecordOutcome) -> CallView: ...


class CallLedger(Outcomes, Standing, Protocol):
    """The pipeline's store: intent and decision, the key claim, refusals and confirmations."""

    def coming(self, commits: int) -> Coming: ...

    def admit(self, req: CallRequest) -> Admission: ...

    async def admit_async(self, req: CallRequest) -> Admission: ...

    def admissible_read(self, req: CallRequest) -> bool: ...

    async def admissible_read_async(self, req: CallRequest) -> bool: ...

    def record_read(self, rec: ReadRecord) -> Admission: ...

    async def record_read_async(self, rec: ReadRecord) -> Admission: ...

    def refuse(self, req: RefusalRequest) -> CallView: ...

    def run_call_count(self, run_id: str, tenant: str) -> int: ...

    def answer_confirmation(self, req: ConfirmationAnswer) -> CallView: ...


class Approvals(Protocol):
    """Deciding and expiring approvals."""

    def get_approval(self, approval_id: str, *, tenant: str | None = None) -> ApprovalView | None: ...

    def decide_approval(self, cmd: DecideApproval) -> ApprovalView: ...

    def retry_requested_by(self, tool_call_id: str) -> str | None: ...

    def expire_approval(self, cmd: ExpireApproval) -> ApprovalView: ...


class Resumption(Standing, Protocol):
    """Resuming approved calls: their held arguments, the dispatch claim or the refusal, expiries."""

    def get_approval(self, approval_id: str, *, tenant: str | None = None) -> ApprovalView | None: ...

    def list_calls(
        self,
        *,
        tenant: str | None = None,
        status: str | None = None,
        unresolved: bool = False,
        limit: int = 100,
    ) -> list[CallView]: ...

    def run_call_count(self, run_id: str, tenant: str) -> int: ...

    def held_arguments(self, approval_id: str) -> Mapping[str, Any] | None: ...

    def retry_requested_by(self, tool_call_id: str) -> str | None: ...

    def release_held_arguments(self, approval_id: str, *, now: datetime) -> None: ...

    def due_approvals(self, *, now: datetime, limit: int = 100) -> list[ApprovalView]: ...

    def dispatch_approved(self, req: ApprovedDispatch) -> CallView: ...

    def deny_approved(self, req: ApprovedDenial) -> CallView: ...

    def expire_approval(self, cmd: ExpireApproval) -> ApprovalView: ...

    def expire_confirmations(self, *, now: datetime, limit: int = 100) -> list[CallView]: ...


class Reconciliation(Contradictions, Protocol):
    """Settling `result_unknown` calls from backend evidence, with leases and escalation; and
    re-checking failures that rest on finding nothing after the commit horizon."""

    def dispatch_times(self, tool_call_id: str) -> tuple[datetime, datetime | None] | None: ...

    def failed_by_hand_at(self, tool_call_id: str) -> datetime | None: ...

    def due_reconciliations(self, *, now: datetime, limit: int = 20) -> list[CallView]: ...

    def start_reconciliation(self, cmd: StartReconciliation) -> CallView: ...

    def record_inconclusive(self, cmd: RecordInconclusive) -> CallView: ...

    def record_recheck(self, cmd: RecordRecheck) -> CallView: ...

    def find_call_by_key(self, tenant: str, subject: str, idempotency_key: str) -> CallView | None: ...

    def resolve_reconciliation(self, cmd: ResolveReconciliation) -> CallView: ...

    def escalate_reconciliation(self, cmd: EscalateReconciliation) -> CallView: ...

    def redispatch(self, cmd: Redispatch) -> CallView: ...


class Agenda(Protocol):
    """Which kinds of background work are due, in one look from the event loop: a hint for the periodic
    passes, never a decision (store.agenda)."""

    async def due_work_async(self, *, now: datetime) -> Due: ...


class Recovery(Protocol):
    """Calls left `dispatching` past their lease become `result_unknown`."""

    def recover_expired(self, *, now: datetime, limit: int = 100) -> list[CallView]: ...


class Pruning(Protocol):
    """Budget counters and loop marks of ended windows deleted, a bounded batch at a time."""

    def prune_expired(self, *, now: datetime, limit: int = ...) -> int: ...


class ManualResolutions(Protocol):
    """A human settling an unresolved call with evidence."""

    def get_call(self, tool_call_id: str, *, tenant: str | None = None) -> CallView | None: ...

    def resolve_manually(self, cmd: ResolveManually) -> CallView: ...


class Outbox(Protocol):
    """Approval notifications waiting for delivery, claimed with a lease."""

    def claim_outbox(self, cmd: ClaimOutbox) -> list[OutboxMessage]: ...

    def outbox_delivered(self, cmd: OutboxDelivered) -> bool: ...

    def outbox_failed(self, cmd: OutboxFailed) -> bool: ...


class Revocations(Standing, Protocol):
    """Revoking and restoring a principal's standing, and checking it."""

    def revoke_principal(self, cmd: RevokePrincipal) -> Revocation: ...

    def restore_principal(self, cmd: RestorePrincipal) -> Revocation: ...


class AuditLog(Protocol):
    """The log's head and hashes, for checkpoints, and verifying the log against them."""

    def log_head(self) -> tuple[int, str]: ...

    def event_hashes(self, after_seq: int, upto_seq: int, partition: str = "") -> list[str]: ...

    def partition_heads(self) -> dict[str, tuple[int, str]]: ...

    async def appended_async(self) -> int: ...

    def verify(self, anchors: Iterable[Anchor] = (), archive: Path | None = None) -> AuditReport: ...


class SecurityLog(Protocol):
    """Where the gateway's rate-bounded `security.*` events are appended."""

    def record_security(self, notes: Sequence[SecurityNote]) -> Sequence[object]: ...


class AuditExport(Protocol):
    """The log as an export reads it: filtered, after a cursor, in seq order."""

    def export(
        self, given: EventFilter | None = None, *, after_seq: int = 0, limit: int | None = None
    ) -> Iterator[dict[str, Any]]: ...


class Oversight(CallReads, Standing, ManualResolutions, AuditExport, Protocol):
    """What the approvals API and the console read, and the manual resolutions they record."""


class CallStatus(CallReads, Standing, Approvals, Protocol):
    """What a client is told of its calls, and the approvals it may withdraw."""


class OAuthGrants(Protocol):
    """The authorization server's clients, codes, refresh tokens and grant families (store.oauth)."""

    def register_client(self, client: RegisteredClient) -> None: ...

    def get_client(self, client_id: str) -> RegisteredClient | None: ...

    def keep_client_document(self, client: RegisteredClient) -> None: ...

    def issue_code(self, code: str, grant: CodeGrant, *, now: datetime) -> None: ...

    def find_code(self, code: str) -> CodeGrant | None: ...

    def nonce_used(self, client_id: str, nonce: str) -> bool: ...

    def redeem_code(self, code: str, *, client_id: str, now: datetime) -> CodeGrant: ...

    def issue_refresh_token(self, token: str, grant: RefreshGrant) -> None: ...

    def find_refresh_token(self, token: str) -> RefreshGrant | None: ...

    def use_refresh_token(
        self, token: str, *, client_id: str, now: datetime, signed_in_after: datetime | None = None
    ) -> RefreshGrant: ...

    def revoke_family(self, family_id: str, *, reason: str, now: datetime) -> bool: ...

    def family_revoked(self, family_id: str) -> bool: ...


class ConsoleSessions(Protocol):
    """The web console's sign-in sessions (store.console_sessions), known by a digest of their id."""

    def open_console_session(self, session_id: str, session: ConsoleSession) -> None: ...

    def console_session(self, session_id: str, *, now: datetime) -> ConsoleSession | None: ...

    def end_console_session(self, session_id: str, *, now: datetime) -> bool: ...


class OAuthClients(Standing, Protocol):
    """An admin's view and control of the clients signed in at the authorization server."""

    def oauth_clients(
        self, *, tenant: str | None, now: datetime, live_after: datetime
    ) -> list[ClientSummary]: ...

    def oauth_client_details(
        self, *, tenant: str | None, now: datetime, live_after: datetime
    ) -> list[ClientDetail]: ...

    def oauth_client(
        self, client_id: str, *, tenant: str | None, now: datetime, live_after: datetime
    ) -> ClientDetail: ...

    def revoke_oauth_client(self, cmd: RevokeClient) -> ClientRevocation: ...


class RunControls(Standing, Protocol):
    """What run controls need: the runs, their calls, and stopping and resuming one."""

    def get_run(self, run_id: str, *, tenant: str | None = None) -> RunView | None: ...

    def list_runs(
        self,
        *,
        tenant: str | None = None,
        status: str | None = None,
        subject: str | None = None,
        limit: int = 100,
    ) -> list[RunView]: ...

    def run_calls(self, run_id: str, *, limit: int = 200) -> list[CallView]: ...

    def events(
        self,
        *,
        run_id: str | None = None,
        tool_call_id: str | None = None,
        tenant: str | None = None,
        after_seq: int = 0,
        limit: int | None = None,
    ) -> list[StoredEvent]: ...

    def stop_run(self, cmd: StopRun) -> RunView: ...

    def resume_run(self, cmd: ResumeRun) -> RunView: ...
