"""The typed events of the log: one pydantic model per type, a shared envelope, and the hash chain."""

from __future__ import annotations

import functools
import hashlib
import os
import re
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from store.canonical import canonical_json, legacy_json

SCHEMA_VERSION = 2
"""Version 2 events are hashed over RFC 8785 canonical JSON; version 1 events over `legacy_json`."""
GENESIS_HASH = "0" * 64
ENVELOPE_FIELDS: tuple[str, ...] = (
    "event_id",
    "seq",
    "type",
    "schema_version",
    "occurred_at",
    "producer",
    "run_id",
    "tool_call_id",
    "approval_id",
    "capability_id",
    "capability_version",
    "policy_version",
    "correlation_id",
    "causation_id",
    "tenant",
    "payload",
    "prev_hash",
    "hash",
)


def json_for(schema_version: int) -> Callable[[Any], str]:
    """The JSON spelling events of `schema_version` are hashed and stored in."""
    # A log written before the bump stays verifiable: each event names the spelling it was hashed in,
    # and schema_version is itself hashed, so relabelling an event breaks its hash like any edit.
    return legacy_json if schema_version == 1 else canonical_json


def compute_hash(envelope: dict[str, Any], payload_text: str | None = None) -> str:
    """sha256 over every envelope field except `hash` itself (seq and prev_hash included).

    `payload_text`, when given, is the payload as `json_for(schema_version)` spells it, which the
    caller has already (it is the stored row's payload): see `hashed_text`.
    """
    return hashlib.sha256(hashed_text(envelope, payload_text).encode("utf-8")).hexdigest()


_HASHED_FIELDS = tuple(name for name in ENVELOPE_FIELDS if name != "hash")
_PAYLOAD_SLOT = '"payload":null'


def hashed_text(envelope: dict[str, Any], payload_text: str | None = None) -> str:
    """The text an envelope's hash is taken over: `json_for(schema_version)` of every field but `hash`.

    With `payload_text` (the payload as that spelling writes it), the rest is spelled with a null
    payload and the payload's text put in its place, not spelled a second time; a property test holds
    this to the whole spelled at once. Both spellings write an object as its keys in sorted order,
    each followed by its value spelled on its own, so the value's text is the same wherever it sits.
    `"payload":null` occurs once: the key's two quotes are unescaped, and inside a spelled string every
    quote is escaped, so the match is the envelope's own `payload` key (no other key ends with it).
    """
    spell = json_for(envelope["schema_version"])
    if payload_text is None:
        return spell({name: envelope[name] for name in _HASHED_FIELDS})
    rest = spell({name: None if name == "payload" else envelope[name] for name in _HASHED_FIELDS})
    head, slot, tail = rest.partition(_PAYLOAD_SLOT)
    if not slot:  # unreachable by the argument above; kept so a mistake fails loudly, not silently
        raise ValueError("the envelope's spelled text has no payload slot")
    return f'{head}"payload":{payload_text}{tail}'


def format_ts(moment: datetime) -> str:
    """ISO-8601 UTC with microseconds and `Z`, so timestamps sort as strings."""
    if moment.tzinfo is UTC:
        # A call's few moments are formatted again and again (each event's envelope, every projection
        # row's columns): about 20 times per read, each a strftime. Only UTC ones are remembered: two
        # moments equal in one zone with another tzinfo may still be different instants (`fold`).
        return _format_utc(moment)
    if moment.tzinfo is None:
        raise ValueError("timestamps must be timezone-aware")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@functools.lru_cache(maxsize=256)
def _format_utc(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# Exactly what format_ts writes. fromisoformat reads it to the same datetime as strptime, many times
# faster; anything else still goes through strptime, so what is accepted or refused is unchanged.
_FORMATTED_TS = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z", re.ASCII)


def parse_ts(text: str) -> datetime:
    if _FORMATTED_TS.fullmatch(text):
        return datetime.fromisoformat(text)
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)


def new_event_id() -> str:
    """A UUID of version 7 (RFC 9562): milliseconds since the epoch, then 74 random bits.

    Ids made one after another sort together, so the unique index on `event_id` grows at its right
    edge, as `seq` does, instead of touching a random page of itself for every event (uuid4).
    """
    millis = time.time_ns() // 1_000_000 & _MILLIS_MASK
    random = int.from_bytes(os.urandom(10), "big")
    value = millis << 80 | random & _RANDOM_MASK | _VERSION_7
    return str(uuid.UUID(int=value))


_MILLIS_MASK = (1 << 48) - 1
_RANDOM_MASK = ~(0xF << 76 | 0x3 << 62) & ((1 << 80) - 1)
_VERSION_7 = 0x7 << 76 | 0x2 << 62  # the version nibble, and the RFC 4122 variant bits


class Payload(BaseModel):
    # Unknown fields survive a read so an older replica can replay a newer replica's events.
    model_config = ConfigDict(extra="allow", frozen=True)


class RunStarted(Payload):
    tenant: str
    subject: str
    implicit: bool = False
    """A run made for one call whose client named none (logs written before runs were Writ's own)."""
    client_run_id: str | None = None
    """What the client called the run; the envelope's `run_id` is Writ's, scoped to the principal."""
    origin: Literal["client", "session"] | None = None
    """What groups the run's calls: the client's `writ/runId`, or its MCP session (absent before)."""


class RunStopped(Payload):
    """A person stopped a run: its later calls are refused `run_stopped`, its waiting approvals
    withdrawn (each an `approval.rejected` caused by this event)."""

    stopped_by: str
    reason: str
    break_glass: bool = False
    withdrawn: list[str] | None = None
    """The approval ids withdrawn with it."""


class RunResumed(Payload):
    """A person resumed a stopped run: it takes calls again (withdrawn approvals stay rejected)."""

    resumed_by: str
    reason: str
    break_glass: bool = False


class ToolCallRetryRequested(Payload):
    """A person asked to re-run this failed call (`writ calls retry`): the retry is a new call
    (`retry_tool_call_id`, whose `tool_call.requested` names this one in `retry_of`), authorized anew."""

    requested_by: str
    reason: str
    break_glass: bool = False
    """Asked by an operator at the store without a token: `requested_by` is `operator:<user>@<host>`."""
    retry_tool_call_id: str
    retry_number: int
    idempotency_key: str
    """The key the retry runs under: this call's own when its backend deduplicates on the key."""
    same_key: bool


class BudgetCharged(Payload):
    budget: str
    key: str
    amount_micros: int
    window_start: str | None = None
    resets_at: str | None = None


class LoopMarked(Payload):
    rule: str
    key: str
    """The pattern (see `store.model.LoopKey.pattern`); the loop marks are a projection of these."""
    window_start: str
    resets_at: str | None = None
    """When the pattern's window ends, after which its mark may be pruned (None: recorded before
    pruning existed, kept)."""


class ToolCallRequested(Payload):
    tool_name: str
    subject: str
    arguments: dict[str, Any]
    action_hash: str
    idempotency_key: str
    key_source: Literal["client", "derived"]
    claims_key: bool
    supersedes: str | None = None
    """The tool_call_id whose claim on the key this call takes over (a derived key past its window)."""
    principal: dict[str, Any]
    decision: dict[str, Any]
    effect_class: str
    summary: str
    external_request_id: str
    dedupe_window_s: int
    contract_hash: str | None = None
    """The hash of the capability's contract when the call was requested (absent before it was kept)."""
    charges: list[BudgetCharged] | None = None
    """The budget counters the call drew on (absent when none did); the counters are their sums."""
    loops: list[LoopMarked] | None = None
    """The loop patterns the call was counted in (absent when no loop rule covered it)."""
    trace_context: dict[str, str] | None = None
    """The W3C trace context (`traceparent`) the call was requested in, when it was traced: later
    spans of the call (approved dispatch, reconciliation) link to it, after a restart too."""
    retry_of: str | None = None
    """The failed call this one re-runs (`writ calls retry`); its `tool_call.retry_requested` names
    this call back. Absent on every call nobody retried."""
    retry_number: int | None = None
    """1 for a retry of a first call, one more for each retry of a retry."""


class ToolCallDenied(Payload):
    reason: str
    rule_id: str | None = None
    message: str | None = None
    detail: str | None = None
    existing_tool_call_id: str | None = None
    """For `idempotency_conflict`: the call that holds the key."""


class ApprovalRequired(Payload):
    approval_id: str
    approver_role: str
    expires_at: str
    requester_may_approve: bool
    action_hash: str
    requester: str


class ApprovalDecided(Payload):
    decided_by: str
    reason: str | None = None
    break_glass: bool = False
    """Decided by an operator at the store without a token (`writ ... --break-glass`), not by a
    verified principal: `decided_by` is then `operator:<os-user>@<host>`."""
    decided_by_roles: list[str] | None = None
    """The roles the decider held when deciding (absent where none was known, as in older events)."""
    withdrawn: Literal["run_stopped"] | None = None
    """Set on a rejection nobody decided on its merits: the approval was withdrawn because its run
    was stopped (`decided_by` stopped it; the event's cause is the `run.stopped`)."""


class ApprovalExpired(Payload):
    reason: str = "expired"


class ConfirmationRequired(Payload):
    """The user is asked in the client to confirm this exact action (capabilities of class `confirm`)."""

    confirmation_id: str
    action_hash: str
    expires_at: str
    requester: str


class ConfirmationAnswered(Payload):
    confirmation_id: str
    answered_by: str
    """The authenticated principal whose client carried the user's answer."""
    action: Literal["accept", "decline", "cancel"]


class ConfirmationExpired(Payload):
    confirmation_id: str
    reason: str = "expired"


class ToolCallDispatching(Payload):
    attempt: int
    idempotency_key: str
    external_request_id: str
    lease_owner: str = ""
    """The worker that holds the dispatch lease (DESIGN §3.5)."""
    fencing_token: int = 0
    """Monotonic per call; every later recording for this dispatch must present it."""
    lease_expires_at: str | None = None
    retry_of_attempt: int | None = None
    """Set when reconciliation re-sends the same key to a backend that deduplicates on it."""
    charges: list[BudgetCharged] | None = None
    """Budget counters an approved call drew on when it ran and not when it was admitted (absent: none)."""


class ToolCallCompleted(Payload):
    result: dict[str, Any] | None = None
    external_request_id: str | None = None
    evidence: dict[str, Any] = Field(default_factory=dict)


class ToolCallFailed(Payload):
    error: str | None = None
    detail: str | None = None
    result: dict[str, Any] | None = None
    evidence: dict[str, Any] = Field(default_factory=dict)


class ToolCallResultUnknown(Payload):
    error: str | None = None
    detail: str | None = None
    evidence: dict[str, Any] = Field(default_factory=dict)
    reconciliation: str = "pending"


RECHECK = "recheck"
"""The method of a `reconciliation.started` that re-checks a `failed` verdict."""


class ReconciliationStarted(Payload):
    method: str
    """`lookup`, `resend`, `none`; or `recheck`: a lookup again of a call settled `failed` because
    nothing was found after its commit horizon, which keeps its status and verification meanwhile."""
    attempt: int = 1
    lease_owner: str = ""
    fencing_token: int = 0
    lease_expires_at: str | None = None


class ReconciliationInconclusive(Payload):
    """One lookup that could not tell, or one re-send under the same key answered with no success;
    the next try is due at `next_attempt_at`."""

    attempt: int
    evidence: dict[str, Any] = Field(default_factory=dict)
    next_attempt_at: str


class ReconciliationRechecked(Payload):
    """A re-check of a `failed` verdict, which rests on finding nothing after the commit horizon, found
    no effect of the call again: the verdict stands. The next re-check is due at `next_recheck_at`;
    none follows the last (None)."""

    attempt: int
    evidence: dict[str, Any] = Field(default_factory=dict)
    next_recheck_at: str | None = None


class ReconciliationResolved(Payload):
    verdict: Literal["confirmed_success", "confirmed_failure"]
    result: dict[str, Any] | None = None
    evidence: dict[str, Any] = Field(default_factory=dict)
    detail: str | None = None
    resolved_by: str | None = None
    """A person who settled the call by hand; None when a lookup at the backend did."""
    break_glass: bool = False
    """Settled by a break-glass operator (`operator:<os-user>@<host>`), not a verified principal."""
    reason: str | None = None
    """Why a break-glass operator acted without a token."""
    recheck_at: str | None = None
    """When the call is looked up again: a `failed` established by finding nothing after the commit
    horizon is re-checked a few times, in case the backend commits past its horizon (absent before)."""


class ReconciliationEscalated(Payload):
    reason: str
    detail: str | None = None
    attempts: int = 0
    evidence: dict[str, Any] = Field(default_factory=dict)


class ReconciliationContradicted(Payload):
    """Later evidence disagrees with a call's settled verdict: recorded beside it, never over it, and the
    call goes to the humans' queue (its verification becomes `inconclusive`, its status stays)."""

    source: Literal["lookup", "late_response", "resolution"]
    """A lookup after the call was settled, the backend's answer to a dispatch whose lease had run
    out, or a person's resolution."""
    settled_status: str
    settled_verification: str
    settled_event_id: str | None = None
    settled_evidence: dict[str, Any] = Field(default_factory=dict)
    verdict: Literal["confirmed_success", "confirmed_failure"]
    """What the new evidence says."""
    evidence: dict[str, Any] = Field(default_factory=dict)
    detail: str | None = None
    by: str | None = None
    """The person, when a resolution contradicts."""


class BudgetExceeded(Payload):
    budget: str
    limit: float
    used: float
    detail: str | None = None
    amount: float | None = None
    """What the refused call would have added."""
    counter_key: str | None = None
    resets_at: str | None = None
    """When the counter's window ends; absent for a budget over a run."""
    scope: str | None = None


class LoopDetected(Payload):
    action_hash: str
    """The refused call's action hash."""
    count: int
    """How many calls of the pattern were admitted in the window (the threshold)."""
    rule: str | None = None
    kind: str | None = None
    """`repeated_action` or `near_identical`."""
    threshold: int | None = None
    key: str | None = None
    """The pattern; its later calls in the window are refused without another `loop.detected`."""
    tool_call_ids: list[str] | None = None
    """The admitted calls of the pattern: the evidence."""
    resets_at: str | None = None
    window_s: int
    detail: str | None = None
    error: str | None = None
    """For `repeated_failure`: the error every call of the evidence failed with."""


class PrincipalRevoked(Payload):
    subject: str
    revoked_by: str
    reason: str | None = None
    break_glass: bool = False
    grants_revoked: int | None = None
    """Sign-ins at Writ's authorization server revoked with it (their refresh and access tokens)."""


class PrincipalRestored(Payload):
    """A revoked subject's standing given back in the event's tenant."""

    subject: str
    restored_by: str
    reason: str | None = None
    break_glass: bool = False


class OAuthClientRevoked(Payload):
    """Every sign-in of one client at Writ's authorization server ended in the event's tenant, by an
    admin (`writ oauth clients revoke`, the API, the console): its refresh and access tokens stop."""

    client_id: str
    revoked_by: str
    sign_ins_ended: int
    client_name: str | None = None
    """The client's own name for itself when it was revoked (its metadata), for the reader."""
    reason: str | None = None
    break_glass: bool = False


class SecurityNoted(Payload):
    """What a `security.*` event stands for: `count` refusals of one kind from one source, first to last.

    Rate-bounded by the gateway (at most one event per kind, source and window), so a flood of bad
    tokens is a few events with counts, not one event per request. Never a token, secret or setting.
    """

    kind: str
    """The reason: `expired`, `bad_signature`, `wrong_audience`... for an authentication; `unknown_tool`;
    `request_too_large`, `rate_limited`, `bad_origin`... at the edge."""
    source: str | None = None
    """The client's address as the gateway saw it (`other` once too many sources are tracked)."""
    count: int
    first_at: str
    last_at: str
    window_s: float
    issuer: str | None = None
    """The token's issuer, only when it is one this gateway trusts."""
    subject: str | None = None
    """The token's subject, only when its signature verified (expired, wrong audience, revoked...)."""
    tool_name: str | None = None
    """For `security.unknown_tool`: the name asked for, cut to 128 printable characters."""
    path: str | None = None
    """For an edge refusal: the request path, cut to 128 printable characters."""
    client_id: str | None = None
    """For `security.oauth_refused`: the client id the request named, cut to 128 printable characters."""
    redirect_host: str | None = None
    """For `security.oauth_refused` of kind `redirect_mismatch`: the host of the redirect URI asked for."""


class Envelope(BaseModel):
    """Fields every event carries; `seq`, `prev_hash` and `hash` are set when the event is appended."""

    model_config = ConfigDict(frozen=True)

    event_id: str = Field(default_factory=new_event_id)
    seq: int = 0
    schema_version: int = SCHEMA_VERSION
    occurred_at: str
    producer: str
    run_id: str | None = None
    tool_call_id: str | None = None
    approval_id: str | None = None
    capability_id: str | None = None
    capability_version: str | None = None
    policy_version: str | None = None
    correlation_id: str | None = None
    causation_id: str | None = None
    tenant: str | None = None
    prev_hash: str = ""
    hash: str = ""

    def envelope(self) -> dict[str, Any]:
        """The event as the plain dict that is hashed, stored and exported."""
        return self.model_dump(mode="json")

    def sealed(self, seq: int, prev_hash: str) -> Self:
        """A copy placed at `seq` after `prev_hash`, with its hash computed."""
        return self.sealed_with_envelope(seq, prev_hash)[0]

    def sealed_with_envelope(self, seq: int, prev_hash: str) -> tuple[Self, dict[str, Any]]:
        """`sealed`, and the sealed copy's envelope, which is computed on the way."""
        sealed, envelope, _ = self.sealed_with_payload_text(seq, prev_hash)
        return sealed, envelope

    def sealed_with_payload_text(self, seq: int, prev_hash: str) -> tuple[Self, dict[str, Any], str]:
        """`sealed_with_envelope`, and the payload as its schema version spells it (the stored row's
        payload): appending needs all three, and the payload is spelled once for the hash and the row."""
        # The envelope of the placed copy is this one's with the three placement fields set: they are
        # plain ints and strings, so setting them in the dumped dict is what dumping the copy gives.
        envelope = self.envelope()
        envelope.update(seq=seq, prev_hash=prev_hash, hash="")
        payload_text = json_for(envelope["schema_version"])(envelope["payload"])
        envelope["hash"] = compute_hash(envelope, payload_text)
        sealed = self.model_copy(update={"seq": seq, "prev_hash": prev_hash, "hash": envelope["hash"]})
        return sealed, envelope, payload_text


class RunStartedEvent(Envelope):
    type: Literal["run.started"] = "run.started"
    payload: RunStarted


class RunStoppedEvent(Envelope):
    type: Literal["run.stopped"] = "run.stopped"
    payload: RunStopped


class ToolCallRetryRequestedEvent(Envelope):
    type: Literal["tool_call.retry_requested"] = "tool_call.retry_requested"
    payload: ToolCallRetryRequested


class RunResumedEvent(Envelope):
    type: Literal["run.resumed"] = "run.resumed"
    payload: RunResumed


class ToolCallRequestedEvent(Envelope):
    type: Literal["tool_call.requested"] = "tool_call.requested"
    payload: ToolCallRequested


class ToolCallDeniedEvent(Envelope):
    type: Literal["tool_call.denied"] = "tool_call.denied"
    payload: ToolCallDenied


class ApprovalRequiredEvent(Envelope):
    type: Literal["approval.required"] = "approval.required"
    payload: ApprovalRequired


class ApprovalGrantedEvent(Envelope):
    type: Literal["approval.granted"] = "approval.granted"
    payload: ApprovalDecided


class ApprovalRejectedEvent(Envelope):
    type: Literal["approval.rejected"] = "approval.rejected"
    payload: ApprovalDecided


class ApprovalExpiredEvent(Envelope):
    type: Literal["approval.expired"] = "approval.expired"
    payload: ApprovalExpired


class ConfirmationRequiredEvent(Envelope):
    type: Literal["confirmation.required"] = "confirmation.required"
    payload: ConfirmationRequired


class ConfirmationGivenEvent(Envelope):
    type: Literal["confirmation.given"] = "confirmation.given"
    payload: ConfirmationAnswered


class ConfirmationDeclinedEvent(Envelope):
    type: Literal["confirmation.declined"] = "confirmation.declined"
    payload: ConfirmationAnswered


class ConfirmationExpiredEvent(Envelope):
    type: Literal["confirmation.expired"] = "confirmation.expired"
    payload: ConfirmationExpired


class ToolCallDispatchingEvent(Envelope):
    type: Literal["tool_call.dispatching"] = "tool_call.dispatching"
    payload: ToolCallDispatching


class ToolCallCompletedEvent(Envelope):
    type: Literal["tool_call.completed"] = "tool_call.completed"
    payload: ToolCallCompleted


class ToolCallFailedEvent(Envelope):
    type: Literal["tool_call.failed"] = "tool_call.failed"
    payload: ToolCallFailed


class ToolCallResultUnknownEvent(Envelope):
    type: Literal["tool_call.result_unknown"] = "tool_call.result_unknown"
    payload: ToolCallResultUnknown


class ReconciliationStartedEvent(Envelope):
    type: Literal["reconciliation.started"] = "reconciliation.started"
    payload: ReconciliationStarted


class ReconciliationInconclusiveEvent(Envelope):
    type: Literal["reconciliation.inconclusive"] = "reconciliation.inconclusive"
    payload: ReconciliationInconclusive


class ReconciliationRecheckedEvent(Envelope):
    type: Literal["reconciliation.rechecked"] = "reconciliation.rechecked"
    payload: ReconciliationRechecked


class ReconciliationResolvedEvent(Envelope):
    type: Literal["reconciliation.resolved"] = "reconciliation.resolved"
    payload: ReconciliationResolved


class ReconciliationEscalatedEvent(Envelope):
    type: Literal["reconciliation.escalated"] = "reconciliation.escalated"
    payload: ReconciliationEscalated


class ReconciliationContradictedEvent(Envelope):
    type: Literal["reconciliation.contradicted"] = "reconciliation.contradicted"
    payload: ReconciliationContradicted


class BudgetExceededEvent(Envelope):
    type: Literal["budget.exceeded"] = "budget.exceeded"
    payload: BudgetExceeded


class LoopDetectedEvent(Envelope):
    type: Literal["loop.detected"] = "loop.detected"
    payload: LoopDetected


class PrincipalRevokedEvent(Envelope):
    type: Literal["principal.revoked"] = "principal.revoked"
    payload: PrincipalRevoked


class PrincipalRestoredEvent(Envelope):
    type: Literal["principal.restored"] = "principal.restored"
    payload: PrincipalRestored


class OAuthClientRevokedEvent(Envelope):
    type: Literal["oauth.client_revoked"] = "oauth.client_revoked"
    payload: OAuthClientRevoked


class SecurityAuthFailedEvent(Envelope):
    type: Literal["security.auth_failed"] = "security.auth_failed"
    payload: SecurityNoted


class SecurityUnknownToolEvent(Envelope):
    type: Literal["security.unknown_tool"] = "security.unknown_tool"
    payload: SecurityNoted


class SecurityEdgeRefusedEvent(Envelope):
    type: Literal["security.edge_refused"] = "security.edge_refused"
    payload: SecurityNoted


class SecurityOAuthRefusedEvent(Envelope):
    type: Literal["security.oauth_refused"] = "security.oauth_refused"
    payload: SecurityNoted


EVENT_TYPES: tuple[type[Envelope], ...] = (
    RunStartedEvent,
    ToolCallRequestedEvent,
    ToolCallDeniedEvent,
    ApprovalRequiredEvent,
    ApprovalGrantedEvent,
    ApprovalRejectedEvent,
    ApprovalExpiredEvent,
    ConfirmationRequiredEvent,
    ConfirmationGivenEvent,
    ConfirmationDeclinedEvent,
    ConfirmationExpiredEvent,
    ToolCallDispatchingEvent,
    ToolCallCompletedEvent,
    ToolCallFailedEvent,
    ToolCallResultUnknownEvent,
    ReconciliationStartedEvent,
    ReconciliationInconclusiveEvent,
    ReconciliationRecheckedEvent,
    ReconciliationResolvedEvent,
    ReconciliationEscalatedEvent,
    ReconciliationContradictedEvent,
    BudgetExceededEvent,
    LoopDetectedEvent,
    PrincipalRevokedEvent,
    PrincipalRestoredEvent,
    OAuthClientRevokedEvent,
    SecurityAuthFailedEvent,
    SecurityUnknownToolEvent,
    SecurityEdgeRefusedEvent,
    SecurityOAuthRefusedEvent,
    RunStoppedEvent,
    RunResumedEvent,
    ToolCallRetryRequestedEvent,
)
TYPE_NAMES: frozenset[str] = frozenset(cls.model_fields["type"].default for cls in EVENT_TYPES)

Event = Annotated[
    RunStartedEvent
    | ToolCallRequestedEvent
    | ToolCallDeniedEvent
    | ApprovalRequiredEvent
    | ApprovalGrantedEvent
    | ApprovalRejectedEvent
    | ApprovalExpiredEvent
    | ConfirmationRequiredEvent
    | ConfirmationGivenEvent
    | ConfirmationDeclinedEvent
    | ConfirmationExpiredEvent
    | ToolCallDispatchingEvent
    | ToolCallCompletedEvent
    | ToolCallFailedEvent
    | ToolCallResultUnknownEvent
    | ReconciliationStartedEvent
    | ReconciliationInconclusiveEvent
    | ReconciliationRecheckedEvent
    | ReconciliationResolvedEvent
    | ReconciliationEscalatedEvent
    | ReconciliationContradictedEvent
    | BudgetExceededEvent
    | LoopDetectedEvent
    | PrincipalRevokedEvent
    | PrincipalRestoredEvent
    | OAuthClientRevokedEvent
    | SecurityAuthFailedEvent
    | SecurityUnknownToolEvent
    | SecurityEdgeRefusedEvent
    | SecurityOAuthRefusedEvent
    | RunStoppedEvent
    | RunResumedEvent
    | ToolCallRetryRequestedEvent,
    Field(discriminator="type"),
]
EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)


def parse_event(envelope: dict[str, Any]) -> Event:
    """Validate a stored or exported envelope dict into its typed event model."""
    return EVENT_ADAPTER.validate_python(envelope)
