"""The store's inputs and outputs: plain frozen dataclasses, free of MCP, HTTP and our other packages.

The gateway turns principals, capabilities and decisions into these before it calls the store.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from store.keys import scoped_key, sent_key

CallStatus = Literal[
    "requested",
    "denied",
    "approval_pending",
    "awaiting_confirmation",
    "approved",
    "rejected",
    "expired",
    "dispatching",
    "completed",
    "failed",
    "result_unknown",
]
TERMINAL_STATUSES: frozenset[str] = frozenset({"denied", "rejected", "expired", "completed", "failed"})
IN_FLIGHT_STATUSES: frozenset[str] = frozenset(
    {"requested", "approval_pending", "awaiting_confirmation", "approved", "dispatching", "result_unknown"}
)

VerificationStatus = Literal[
    "not_observed", "pending", "confirmed_success", "confirmed_failure", "inconclusive"
]
ApprovalStatus = Literal["awaiting_approval", "approved", "rejected", "expired"]
KeySource = Literal["client", "derived"]
AdmissionKind = Literal["new", "joined", "conflict"]
DecisionEffect = Literal["allow", "deny", "require_approval"]
Answer = Literal["accept", "decline", "cancel"]
"""A user's answer to a confirmation round."""


class StoreError(Exception):
    """Root of the errors raised by this package."""

    retryable: bool = False


class NotFound(StoreError):
    pass


class RetryRefused(StoreError):
    """The call may not be retried now (checked under the head lock): `reason` is a reason code."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


class StaleLease(StoreError):
    """A writer tried to record for a call it no longer owns."""


class Unavailable(StoreError):
    """The database could not be reached or stayed locked past the timeout, or the connection was lost.

    The write did not happen, except when the connection was lost while its COMMIT was on the way: then
    it may have. Callers treat the write as in doubt (a call admitted that way is never dispatched by
    this process; its lease runs out and reconciliation settles it).
    """

    retryable = True


class ConfirmationMismatch(StoreError):
    """A confirmation answer names another confirmation or another action than the call awaits."""


class CorruptEvent(StoreError):
    """A stored event cannot be read back as an event (its payload is not JSON, or not of its type's
    shape): the log was altered behind the store's back."""

    def __init__(self, seq: Any, what: str) -> None:
        super().__init__(f"event {seq} {what}: the log was altered (writ audit verify names the damage)")
        self.seq = seq


class ScratchUnavailable(StoreError):
    """Verify's scratch database (a temporary SQLite file the size of the projections) could not be
    made or written: no room in `$TMPDIR`, or no such directory. Nothing was found about the log."""


class KeyClaimLost(StoreError):
    """Another call took the idempotency key between reading and claiming it."""

    retryable = True


@dataclass(frozen=True, slots=True)
class ApprovalNeed:
    """Who must approve a call and for how long the approval may wait, as policy required it."""

    approver_role: str
    expires_in_s: int = 3600
    requester_may_approve: bool = False


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    """The policy decision as the store records it with a call's intent.

    The gateway builds it from policy's `Decision`; the store knows nothing of policy.
    """

    effect: DecisionEffect
    reason: str
    """A stable reason code, e.g. `amount_over_limit`."""
    policy_version: str
    rule_id: str | None = None
    approval: ApprovalNeed | None = None
    """Set when the effect is `require_approval`."""
    message: str | None = None
    """The deciding rule's `message` (the operator's words), or Writ's own text for its own reasons."""
    also_matched: tuple[str, ...] = ()
    """The other rules that matched the call."""

    def to_json(self) -> dict[str, Any]:
        """The `decision` of a `tool_call.requested` payload; its keys and their order are hashed."""
        # `also_matched` only when some did: a decision of one rule is written as it always was.
        also = {"also_matched": list(self.also_matched)} if self.also_matched else {}
        return {
            "effect": self.effect,
            "reason": self.reason,
            "policy_version": self.policy_version,
            "rule_id": self.rule_id,
            "approval": (
                {
                    "approver_role": self.approval.approver_role,
                    "expires_in_s": self.approval.expires_in_s,
                    "requester_may_approve": self.approval.requester_may_approve,
                }
                if self.approval
                else None
            ),
            "message": self.message,
            **also,
        }


@dataclass(frozen=True, slots=True)
class PrincipalRecord:
    """Who asked, as the store records it with a request: the verified principal's facts, in the shape
    `Principal.to_json()` gives them (the gateway converts; the store imports nothing of policy)."""

    subject: str
    tenant: str = "default"
    roles: tuple[str, ...] = ()
    scopes: tuple[str, ...] = ()
    client_id: str | None = None
    groups: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "subject": self.subject,
            "tenant": self.tenant,
            "roles": sorted(self.roles),
            "scopes": sorted(self.scopes),
            "client_id": self.client_id,
            "groups": sorted(self.groups),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PrincipalRecord:
        """A recorded principal; rows written before a field existed lack it and get its default."""
        return cls(
            subject=str(data["subject"]),
            tenant=str(data.get("tenant", "default")),
            roles=tuple(data.get("roles") or ()),
            scopes=tuple(data.get("scopes") or ()),
            client_id=data.get("client_id"),
            groups=tuple(data.get("groups") or ()),
        )


RunOrigin = Literal["client", "session"]
RunStatus = Literal["active", "stopped"]


@dataclass(frozen=True, slots=True)
class RunView:
    """A run as its projection holds it: whose, since when, how many calls, and whether it is stopped."""

    run_id: str
    tenant: str
    subject: str
    started_at: datetime
    call_count: int
    origin: str | None
    status: str
    stopped_at: datetime | None = None
    stopped_by: str | None = None
    stop_reason: str | None = None


@dataclass(frozen=True, slots=True)
class CallIdentity:
    """Who asked for which action under which key: what an admission and a refusal record alike."""

    tool_call_id: str
    run_id: str | None
    """Writ's id of the run the call is in; None for a call in no run (no runId and no session)."""
    run_origin: RunOrigin | None
    """What groups the run's calls, recorded when the call starts it: the client's runId or its session."""
    tenant: str
    subject: str
    principal: PrincipalRecord
    tool_name: str
    capability_id: str
    capability_version: str
    arguments: Mapping[str, Any]
    """Arguments as they may be stored: redacted fields already replaced by salted hashes."""
    action_hash: str
    idempotency_key: str
    key_source: KeySource
    correlation_id: str
    now: datetime
    contract_hash: str | None = None
    """The hash of the capability's contract the action hash covers."""
    client_run_id: str | None = None
    """The client's own name for the run (`run_id` is Writ's, scoped to the principal)."""
    trace_context: Mapping[str, str] | None = None
    """The W3C trace context (`traceparent`) the call was requested in, if traced."""
    retry: RetryLink | None = None
    """Set when a person re-runs a failed call (`writ calls retry`): what the store records first."""

    @property
    def sent_key(self) -> str:
        """The key the call's dispatch sends the backend: the client's, scoped to the principal."""
        return scoped_key(self.tenant, self.subject, self.idempotency_key)


@dataclass(frozen=True, slots=True)
class RetryLink:
    """A retry of a failed call, asked for by a person: the store records it on the original
    (`tool_call.retry_requested`) in the transaction that admits or refuses the retry itself."""

    of: str
    """The failed call re-run."""
    number: int
    requested_by: str
    reason: str
    break_glass: bool
    same_key: bool


@dataclass(frozen=True, slots=True)
class Charge:
    """What a call adds to one budget counter, in millionths of the budget's unit (sums stay exact)."""

    budget_id: str
    counter_key: str
    """Names the counter: its budget, scope and window (the gateway hashes them)."""
    amount_micros: int
    limit_micros: int
    window_start: datetime | None = None
    """None for a counter over a run's lifetime."""
    resets_at: datetime | None = None
    scope: str = ""
    approval: ApprovalNeed | None = None
    """Who decides a call past this limit (`on_exceed: require_approval`); None: it is refused."""


@dataclass(frozen=True, slots=True)
class Breach:
    """The budget a call would have taken past its limit, as `budget.exceeded` records it."""

    budget_id: str
    limit_micros: int
    used_micros: int
    amount_micros: int
    resets_at: datetime | None
    scope: str
    counter_key: str


@dataclass(frozen=True, slots=True)
class LoopKey:
    """A loop pattern a call belongs to: the store counts the admitted calls of each in its window."""

    rule_id: str
    kind: str
    """`repeated_action`, `near_identical`, or `repeated_failure` (its calls that failed are counted,
    per error)."""
    pattern: str
    """Names the pattern: rule, principal, capability, kept arguments and window (the policy hashes them)."""
    threshold: int
    """How many calls of the pattern are admitted in the window; the next is refused."""
    window_s: int
    window_start: datetime
    resets_at: datetime
    action: str = "deny"
    """`deny`, or `pause_run`: the call that finds the loop also stops its run (if it is in one)."""


@dataclass(frozen=True, slots=True)
class LoopHit:
    """A loop a call was refused for, as `loop.detected` records it."""

    rule_id: str
    kind: str
    pattern: str
    threshold: int
    window_s: int
    resets_at: datetime
    tool_call_ids: tuple[str, ...]
    """The admitted calls of the pattern in the window, in the order they were recorded."""
    first: bool
    """Whether this refusal detected the loop (records `loop.detected`); later ones only refuse."""
    error: str | None = None
    """For `repeated_failure`: the error the calls failed with."""
    action: str = "deny"
    """The rule's `on_detect`: `deny`, or `pause_run`."""
    paused_run: str | None = None
    """The run Writ stopped for this loop (`on_detect: pause_run`), if the call was in one."""


@dataclass(frozen=True, slots=True)
class CallRequest:
    """Everything `Store.admit` needs to record a new call's intent and decision in one transaction."""

    identity: CallIdentity
    dedupe_window_s: int
    decision: DecisionRecord
    policy_version: str
    effect_class: str
    summary: str
    external_request_id: str
    approval_id: str | None = None
    """Set when the decision is `require_approval`."""
    approval_expires_at: datetime | None = None
    lease_owner: str = "writ-gateway"
    """Who dispatches an allowed call; the dispatch lease is theirs until `now + lease_s`."""
    lease_s: float = 60.0
    """Capability timeout plus a margin: past it, recovery may declare the dispatch unknown."""
    held_arguments: Mapping[str, Any] | None = None
    """The full arguments (unredacted), kept with an approval until the approved call is dispatched."""
    notification: Mapping[str, Any] | None = None
    """When set, an `approval.required` outbox message with this payload joins the approval's transaction."""
    confirmation_id: str | None = None
    """Set when an allowed call must first be confirmed by the user in the client (effect `confirm`)."""
    confirmation_expires_at: datetime | None = None
    charges: tuple[Charge, ...] = ()
    """Budget counters the call draws on; if any would pass its limit, the call is refused instead."""
    loops: tuple[LoopKey, ...] = ()
    """Loop patterns the call belongs to; if one already reached its threshold, the call is refused."""
    over_budget: DecisionRecord | None = None
    """The decision recorded instead if only budgets saying `require_approval` would pass their limit:
    the call then waits for a person under `approval_id` (set with it), charged past the limit."""


@dataclass(frozen=True, slots=True)
class CallView:
    """The tool-calls projection row for one call."""

    tool_call_id: str
    run_id: str | None
    tenant: str
    subject: str
    tool_name: str
    capability_id: str
    capability_version: str
    action_hash: str
    idempotency_key: str
    key_source: str
    status: CallStatus
    verification_status: VerificationStatus
    decision_effect: str
    reason: str | None
    policy_version: str
    arguments: Mapping[str, Any]
    summary: str
    external_request_id: str
    approval_id: str | None
    result: Mapping[str, Any] | None
    """The recorded `ToolResult.to_json()` once completed or failed with a result."""
    error: str | None
    created_at: datetime
    updated_at: datetime
    dedupe_window_s: int = 600
    attempts: int = 0
    effect_class: str = ""
    correlation_id: str | None = None
    principal: PrincipalRecord | None = None
    """The principal as recorded with the request (None for rows from before it was kept)."""
    approval_expires_at: datetime | None = None
    lease_owner: str | None = None
    lease_token: int = 0
    """The fencing token of the newest lease; recording for a lease needs exactly this token."""
    lease_expires_at: datetime | None = None
    reconcile_attempts: int = 0
    next_reconcile_at: datetime | None = None
    resolved_by: str | None = None
    """The person who settled an unknown outcome by hand."""
    confirmation_id: str | None = None
    confirmation_expires_at: datetime | None = None
    contract_hash: str | None = None
    """The capability's contract when the call was requested (None for calls recorded before it was)."""
    key_scoped: bool = False
    """Its last dispatch sent the key scoped to the principal (`store.keys`); False before the first
    dispatch, and for a call dispatched before keys were scoped, which keeps its plain key."""

    @property
    def sent_key(self) -> str:
        """The idempotency key as the backend got it on the call's last dispatch: what a lookup asks
        for and a re-send sends again (the client's key itself before any dispatch)."""
        return sent_key(self.tenant, self.subject, self.idempotency_key, scoped=self.key_scoped)

    @property
    def escalated(self) -> bool:
        """Unknown, and reconciliation gave up: a human must settle it."""
        return self.status == "result_unknown" and self.verification_status == "inconclusive"

    @property
    def contradicted(self) -> bool:
        """Settled, and later evidence disagreed (`reconciliation.contradicted`): a human must check it."""
        return self.status in ("completed", "failed") and self.verification_status == "inconclusive"

    @property
    def unresolved(self) -> bool:
        """Waiting for reconciliation or a person: unknown, or contradicted."""
        return self.status == "result_unknown" or self.contradicted


@dataclass(frozen=True, slots=True)
class Admission:
    """What `Store.admit` did with a request.

    `new`: recorded; if the decision was allow, the call is now `dispatching` and the caller owns dispatch.
    `joined`: the key already names an identical call; `call` is that call's recorded state.
    `conflict`: the key names a call with a different action; nothing was claimed, the refusal is recorded
    as a new denied call (`call`), `existing` is the call that holds the key.
    """

    kind: AdmissionKind
    call: CallView
    existing: CallView | None = None
    breach: Breach | None = None
    """Set when the call was refused `budget_exceeded`: the budget it would have passed."""
    loop: LoopHit | None = None
    """Set when the call was refused `loop_detected`: the loop it belongs to."""

    @property
    def owns_dispatch(self) -> bool:
        return self.kind == "new" and self.call.status == "dispatching"


@dataclass(frozen=True, slots=True)
class OutcomeRecord:
    """What the pipeline observed from an executor, to be recorded as the call's outcome."""

    kind: Literal["completed", "failed", "unknown"]
    result: Mapping[str, Any] | None = None
    error: str | None = None
    detail: str | None = None
    external_request_id: str | None = None
    evidence: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ReadRecord:
    """A read allowed outright that already ran: `Store.record_read` records it in one transaction."""

    request: CallRequest
    outcome: OutcomeRecord
    observed_at: datetime
    """When the executor's answer came back (the intent and decision are dated `request`'s now)."""


@dataclass(frozen=True, slots=True)
class RefusalRequest:
    """A call refused before it could claim a key (invalid arguments): recorded as requested + denied."""

    identity: CallIdentity
    reason: str
    detail: str
    policy_version: str
    summary: str = ""


@dataclass(frozen=True, slots=True)
class ConfirmationAnswer:
    """The user's answer to a call's pending confirmation, for `Store.answer_confirmation`."""

    tool_call_id: str
    confirmation_id: str
    action_hash: str
    """The action the answer was given for; it must be the action the call awaits."""
    action: Answer
    answered_by: str
    now: datetime
    lease_owner: str = "writ-gateway"
    """Who dispatches an accepted call; the dispatch lease is theirs until `now + lease_s`."""
    lease_s: float = 60.0


@dataclass(frozen=True, slots=True)
class ApprovedDispatch:
    """The claim of an approved call's dispatch, for `Store.dispatch_approved`."""

    tool_call_id: str
    now: datetime
    policy_version: str | None = None
    """The policy version the call was re-authorized under."""
    lease_owner: str = "writ-gateway"
    lease_s: float = 60.0
    charges: tuple[Charge, ...] = ()
    """The budget counters the current policy says the call draws on now: those it was not charged on
    at admission (a window that rolled over while it waited, a budget added) are checked and charged."""
    loops: tuple[LoopKey, ...] = ()
    """The loop patterns the call belongs to now: one found to loop since it was admitted refuses it."""


@dataclass(frozen=True, slots=True)
class ApprovedDenial:
    """The refusal of an approved call that failed re-authorization, for `Store.deny_approved`."""

    tool_call_id: str
    reason: str
    now: datetime
    detail: str | None = None
    policy_version: str | None = None
    """The policy in force when it was refused."""
    rule_id: str | None = None
    """The rule that refused it, when policy did."""


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """One event of the log, as read back."""

    seq: int
    event_id: str
    type: str
    schema_version: int
    occurred_at: str
    producer: str
    run_id: str | None
    tool_call_id: str | None
    approval_id: str | None
    capability_id: str | None
    capability_version: str | None
    policy_version: str | None
    correlation_id: str | None
    causation_id: str | None
    tenant: str | None
    payload: Mapping[str, Any]
    prev_hash: str
    hash: str


@dataclass(frozen=True, slots=True)
class ApprovalView:
    approval_id: str
    tool_call_id: str
    tenant: str
    status: ApprovalStatus
    requester: str
    approver_role: str
    requester_may_approve: bool
    action_hash: str
    expires_at: datetime
    created_at: datetime
    decided_by: str | None = None
    decided_at: datetime | None = None
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class OutboxMessage:
    """One notification in the transactional outbox and where its delivery stands."""

    message_id: str
    topic: str
    tenant: str
    approval_id: str | None
    tool_call_id: str | None
    payload: Mapping[str, Any]
    status: Literal["pending", "delivered", "dead"]
    attempts: int
    next_attempt_at: datetime
    created_at: datetime
    last_error: str | None = None
    delivered_at: datetime | None = None
    lease_owner: str | None = None


@dataclass(frozen=True, slots=True)
class PartitionClaim:
    """What a checkpoint vouches for in one partition of the log: it held `seq` events ending in `hash`,
    and `digests` are the first 16 hex digits of the hashes of its seqs `from_seq`+1 to `seq`, so that
    a rewrite inside that range is named at its own seq (none: vouched for by the head alone)."""

    partition: str
    seq: int
    hash: str
    from_seq: int
    digests: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Anchor:
    """What a signed checkpoint kept outside the database vouches for; the gateway checked its signature.

    Partition "" (the whole log unless it is partitioned) held `seq` events ending in `hash`, and began
    with an event hashing to `log_id`; `digests` are the first 16 hex digits of the hashes of seqs
    `from_seq`+1 to `seq`, so that a rewrite inside that range is named at its own seq. A checkpoint of
    a partitioned log made while "" was empty has `seq` 0 and `log_id` the genesis hash.
    """

    log_id: str
    seq: int
    hash: str
    from_seq: int
    digests: tuple[str, ...]
    source: str
    """Where the checkpoint came from (file and line, key id), for messages."""
    heads: tuple[PartitionClaim, ...] = ()
    """What it vouches for in every other partition of the log (each with digests of its own since the
    previous checkpoint, or, in a checkpoint made before they had them, its head alone)."""

    def claims(self) -> tuple[PartitionClaim, ...]:
        """What it vouches for in every partition, "" first (unless it was empty)."""
        own = PartitionClaim("", self.seq, self.hash, self.from_seq, self.digests)
        return ((own,) if self.seq > 0 else ()) + self.heads


@dataclass(frozen=True, slots=True)
class ProjectionDifference:
    """The first row where a projection the runtime acts on differs from a replay of the log."""

    table: str
    key: tuple[tuple[str, str], ...]
    """The row's primary key, column by column, as text."""
    column: str | None
    """The first column that differs; None when the row exists on one side only."""
    stored: str
    """What the database holds (`absent` when it has no such row)."""
    replayed: str
    """What the log says it should hold (`absent` when the replay made no such row)."""

    def describe(self) -> str:
        key = ", ".join(f"{name}={value}" for name, value in self.key)
        if self.column is None:
            return f"{self.table} [{key}]: stored {self.stored}, replayed {self.replayed}"
        return f"{self.table} [{key}] column {self.column}: stored {self.stored}, replayed {self.replayed}"


@dataclass(frozen=True, slots=True)
class GrammarViolation:
    """The first event that no sequence the store writes could contain (store.grammar)."""

    seq: int
    rule: str
    """A short name of the rule broken, such as `dispatch_without_approval`."""
    detail: str
    tool_call_id: str | None = None

    def describe(self) -> str:
        call = f" (call {self.tool_call_id})" if self.tool_call_id else ""
        return f"seq {self.seq}{call}: {self.rule}: {self.detail}"


@dataclass(frozen=True, slots=True)
class AuditReport:
    chain_ok: bool
    """The hash chain, the head and the anchors agree (what `problem` describes when they do not)."""
    events_checked: int
    first_bad_seq: int | None = None
    problem: str | None = None
    """`edited`, `deleted`, `inserted`, `reordered`, `truncated`, `broken_chain`, `head_missing`,
    `rewritten` (a checkpoint vouches for another hash) or `foreign_checkpoint` (made for another log),
    with detail."""
    detail: str | None = None
    anchors_checked: int = 0
    anchored_seq: int = 0
    """The newest seq of partition "" a checkpoint vouches for (0: none)."""
    unanchored_events: int = 0
    """Events after the newest seq a checkpoint vouches for in their partition: intact as a chain, but
    a rewrite of them would not be caught."""
    anchored_events: int = 0
    """Events of every partition up to the newest seq a checkpoint vouches for in each."""
    replayed: bool = False
    """The whole log was replayed: the grammar was checked, and the projections compared unless an event
    could not be applied (a grammar violation says which)."""
    projections_compared: bool = False
    projection_difference: ProjectionDifference | None = None
    differing_tables: tuple[str, ...] = ()
    """Every projection with at least one differing row, the first difference's table first."""
    grammar_violation: GrammarViolation | None = None
    partition: str | None = None
    """The partition of the log whose chain `problem` is in ("": the whole log unless partitioned)."""

    @property
    def ok(self) -> bool:
        """Nothing was found: chain, anchors, grammar and projections all agree with the log."""
        return (
            self.chain_ok
            and self.grammar_violation is None
            and self.projection_difference is None
            and (self.projections_compared or not self.replayed)
        )
