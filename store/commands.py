"""One frozen command per store write: what the write records, built once by the caller.

The store method takes the command whole, so a layer that relays a write relays one object, and a new
field breaks no signature between the face and the store. Who records (the producer) is the store's.
Field names are the write's former keywords.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from store.model import OutcomeRecord

Verdict = Literal["confirmed_success", "confirmed_failure"]
ContradictionSource = Literal["lookup", "late_response", "resolution"]


@dataclass(frozen=True, slots=True)
class RecordOutcome:
    """Record what the executor observed for a call dispatched under the lease's fencing `token`."""

    tool_call_id: str
    outcome: OutcomeRecord
    token: int
    now: datetime


@dataclass(frozen=True, slots=True)
class DecideApproval:
    """Grant or reject an awaiting approval."""

    approval_id: str
    approve: bool
    decided_by: str
    now: datetime
    reason: str | None = None
    tenant: str | None = None
    """When given, an approval of another tenant is not found."""
    break_glass: bool = False
    decided_by_roles: Collection[str] | None = None
    """The roles the decider holds now, recorded with the decision (None: unknown, a CLI operator)."""


@dataclass(frozen=True, slots=True)
class ExpireApproval:
    """Expire an awaiting approval past its expiry."""

    approval_id: str
    now: datetime


@dataclass(frozen=True, slots=True)
class ResolveManually:
    """A person settles an unknown or contradicted call, or contradicts a settled one, with evidence."""

    tool_call_id: str
    succeeded: bool
    evidence: str
    by: str
    now: datetime
    tenant: str | None = None
    break_glass: bool = False
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class StartReconciliation:
    """Take an unknown call's reconciliation lease, if its fencing token is still `expected_token`."""

    tool_call_id: str
    expected_token: int
    method: str
    owner: str
    lease_s: float
    now: datetime


@dataclass(frozen=True, slots=True)
class RecordInconclusive:
    """A lookup could not tell; the next one is due at `next_attempt_at`."""

    tool_call_id: str
    token: int
    evidence: Mapping[str, Any]
    next_attempt_at: datetime
    now: datetime


@dataclass(frozen=True, slots=True)
class ResolveReconciliation:
    """The backend confirmed the effect (`completed`) or its failure (`failed`)."""

    tool_call_id: str
    token: int
    verdict: Verdict
    evidence: Mapping[str, Any]
    now: datetime
    result: Mapping[str, Any] | None = None
    detail: str | None = None
    recheck_at: datetime | None = None
    """When a `failed` established by finding nothing after the commit horizon is looked up again."""


@dataclass(frozen=True, slots=True)
class RecordRecheck:
    """A re-check of a `failed` verdict found no effect of the call: the verdict stands; the next
    re-check is due at `next_recheck_at`, or none follows."""

    tool_call_id: str
    token: int
    evidence: Mapping[str, Any]
    next_recheck_at: datetime | None
    now: datetime


@dataclass(frozen=True, slots=True)
class EscalateReconciliation:
    """Give up looking: the call waits for a person."""

    tool_call_id: str
    token: int
    reason: str
    now: datetime
    detail: str | None = None
    evidence: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Redispatch:
    """Re-send the same key to a backend that deduplicates on it: a recorded retry with a new lease."""

    tool_call_id: str
    token: int
    owner: str
    lease_s: float
    now: datetime


@dataclass(frozen=True, slots=True)
class RecordContradiction:
    """Evidence against a settled verdict: recorded beside it and escalated, never overwriting it."""

    tool_call_id: str
    source: ContradictionSource
    verdict: Verdict
    evidence: Mapping[str, Any]
    detail: str | None
    now: datetime
    by: str | None = None
    """The person whose resolution contradicts the verdict (source `resolution`)."""
    token: int | None = None
    """The fencing token of the re-check lease the lookup ran under (a re-check of a `failed`
    verdict): recorded only while that lease is current and the failure not yet contradicted."""


@dataclass(frozen=True, slots=True)
class ClaimOutbox:
    """Lease up to `limit` due notifications to `owner` for delivery."""

    owner: str
    now: datetime
    lease_s: float = 30.0
    limit: int = 10
    topics: tuple[str, ...] = ()
    """Only messages of these topics (each webhook delivers its own); empty: every topic."""


@dataclass(frozen=True, slots=True)
class EnqueueOutbox:
    """A notification that announces no call (a checkpoint), queued for delivery at `now`."""

    message_id: str
    topic: str
    payload: Mapping[str, Any]
    now: datetime
    tenant: str = ""


@dataclass(frozen=True, slots=True)
class OutboxDelivered:
    """The receiver took the message; only its lease holder may say so."""

    message_id: str
    owner: str
    now: datetime


@dataclass(frozen=True, slots=True)
class OutboxFailed:
    """Delivery failed: retried from `retry_at`, or dead when None."""

    message_id: str
    owner: str
    error: str
    retry_at: datetime | None
    now: datetime


@dataclass(frozen=True, slots=True)
class RevokePrincipal:
    """Revoke a subject's standing in a tenant; `break_glass` marks an operator without a token."""

    tenant: str
    subject: str
    revoked_by: str
    now: datetime
    reason: str | None = None
    break_glass: bool = False


@dataclass(frozen=True, slots=True)
class RestorePrincipal:
    """Give a revoked subject its standing back in a tenant."""

    tenant: str
    subject: str
    restored_by: str
    now: datetime
    reason: str | None = None
    break_glass: bool = False


@dataclass(frozen=True, slots=True)
class StopRun:
    """Stop a run: its later calls are refused `run_stopped` and its waiting approvals withdrawn."""

    run_id: str
    stopped_by: str
    reason: str
    now: datetime
    tenant: str | None = None
    """The stopper's tenant: a run of another tenant is not found. None only for break-glass."""
    break_glass: bool = False


@dataclass(frozen=True, slots=True)
class ResumeRun:
    """Resume a stopped run: it takes calls again."""

    run_id: str
    resumed_by: str
    reason: str
    now: datetime
    tenant: str | None = None
    break_glass: bool = False
