"""Every reason code Writ emits, and the HTTP status each one answers with: a contract with clients.

A code travels as `reason` in a denied status document (DESIGN §6) and in events (`tool_call.denied`,
`reconciliation.escalated`), and as `error` in an API or HTTP error body. The catalogue lives in the
gateway's lowest layer, where every face and the call domain can use it. The store and policy are
below the gateway and import none of it: they emit their few codes as plain strings
(`store.recording`, `store.projector`, `policy.engine`), and tests/gateway/test_reasons.py checks that
those, and every other literal reason in the tree, are members here. A policy rule's own `reason` is
free text chosen by the policy's author and passes through as a `str`.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType


class ReasonCode(StrEnum):
    """Why Writ refused, denied or escalated something (the value is what clients see)."""

    # Policy and the call pipeline: a tool call is denied before anything runs.
    NO_MATCHING_RULE = "no_matching_rule"
    """No policy rule matched the call (policy denies by default)."""
    POLICY_ERROR = "policy_error"
    """A rule's condition failed to evaluate; policy denies rather than guess."""
    DENIED = "denied"
    """Policy denied with no reason of its own (the store's fallback for a reasonless decision)."""
    CONFIRMATION_UNAVAILABLE = "confirmation_unavailable"
    """A `confirm` capability was called by a client that cannot be asked to confirm."""
    INVALID_ARGUMENTS = "invalid_arguments"
    """The arguments do not fit the tool's input schema, or cannot be recorded."""
    IDEMPOTENCY_CONFLICT = "idempotency_conflict"
    """The idempotency key already names a different action (DESIGN §3.2)."""
    RATE_LIMITED = "rate_limited"
    """The principal called too often; nothing was recorded or run."""
    PRINCIPAL_REVOKED = "principal_revoked"
    """The principal was revoked in its tenant; every face refuses it."""
    BUDGET_EXCEEDED = "budget_exceeded"
    """The call would take a budget of `policy.budgets` past its limit in the current window."""
    LOOP_DETECTED = "loop_detected"
    """The call repeats, or nearly, one a rule of `policy.loops` saw too often in its window."""
    RUN_STOPPED = "run_stopped"
    """A person stopped the call's run (`writ runs stop`, the API, the console); it takes no calls."""

    # Confirmation rounds (capabilities of class `confirm`).
    CONFIRMATION_MISMATCH = "confirmation_mismatch"
    """The answer is bound to another call, confirmation or action than the one it answers."""
    CONFIRMATION_USED = "confirmation_used"
    """The call no longer awaits this confirmation: answered before, or expired."""
    USER_DECLINED = "user_declined"
    """The user declined the confirmation round; the call is denied."""
    USER_CANCELLED = "user_cancelled"
    """The user cancelled the confirmation round; the call is denied."""
    CONFIRMATION_EXPIRED = "confirmation_expired"
    """The user never answered the confirmation round in time; the call will not run."""

    # Re-authorization of an approved call before it runs (DESIGN §3.4).
    APPROVAL_MISSING = "approval_missing"
    """The call to resume has no granted approval."""
    CAPABILITY_UNAVAILABLE = "capability_unavailable"
    """The approved call's tool is no longer registered."""
    CAPABILITY_CHANGED = "capability_changed"
    """The capability's version or contract changed while the call waited for approval."""
    ARGUMENTS_UNAVAILABLE = "arguments_unavailable"
    """The held full arguments of an approved call with redacted fields are gone."""
    APPROVAL_BINDING_MISMATCH = "approval_binding_mismatch"
    """The action to run is not the action that was approved."""
    APPROVER_REVOKED = "approver_revoked"
    """The approver was revoked after approving."""
    APPROVAL_INSUFFICIENT = "approval_insufficient"
    """The current policy needs an approval by another role than the one given."""
    SELF_APPROVAL_FORBIDDEN = "self_approval_forbidden"
    """The requester approved their own call, or whoever asked for a retry approved that retry, and
    the policy does not allow a requester to approve."""

    # Control commands: deciding approvals, resolving calls, changing standing (API, console, CLI).
    INVALID_REQUEST = "invalid_request"
    """The request body or a value in it is malformed or cannot be recorded."""
    INVALID_COMMAND = "invalid_command"
    """A CLI command was called in a way that cannot act (contradicting or missing flags)."""
    INVALID_TOKEN = "invalid_token"
    """The bearer token is missing, does not verify, or its claims are unusable."""
    INSUFFICIENT_ROLE = "insufficient_role"
    """The principal lacks the role the route or command needs."""
    OTHER_TENANT = "other_tenant"
    """A CLI token acts in another tenant than the one named."""
    NOT_FOUND = "not_found"
    """No such approval, call or run in the principal's tenant."""
    NOT_APPROVER = "not_approver"
    """The decider lacks the role this approval needs."""
    ALREADY_DECIDED = "already_decided"
    """The approval was already approved or rejected; nothing changed."""
    EXPIRED = "expired"
    """The approval expired before it was decided; nothing changed."""
    NOT_UNRESOLVED = "not_unresolved"
    """The call to resolve by hand is no longer of unknown outcome."""
    SELF_RESOLUTION_FORBIDDEN = "self_resolution_forbidden"
    """The person resolving a call's outcome by hand is the one who made the call."""
    NOT_REVOKED = "not_revoked"
    """The principal to restore has no revocation to lift."""
    RUN_ALREADY_STOPPED = "run_already_stopped"
    """The run to stop is stopped already; nothing changed."""
    RUN_NOT_STOPPED = "run_not_stopped"
    """The run to resume is not stopped; nothing changed."""
    RETRY_NOT_FAILED = "retry_not_failed"
    """Only a failed call (`failed`, or reconciled `confirmed_failure`) is retried; this one is
    completed, pending, of unknown outcome, or its failure is contradicted."""
    ALREADY_RETRIED = "already_retried"
    """The call was retried before; retry its retry (named in the refusal) instead."""

    # HTTP edges, before any route runs.
    REQUEST_TOO_LARGE = "request_too_large"
    """The request body is over the configured limit."""
    REQUEST_TIMEOUT = "request_timeout"
    """The request body did not arrive within the configured time."""

    # Reconciliation hands a call of unknown outcome to a person (`reconciliation.escalated`).
    NO_RECONCILIATION_METHOD = "no_reconciliation_method"
    """The capability offers no way to learn the outcome."""
    CAPABILITY_UNKNOWN = "capability_unknown"
    """The call's capability is no longer registered, so nothing can look its outcome up."""
    INCONCLUSIVE_AFTER_RETRIES = "inconclusive_after_retries"
    """Every lookup allowed was inconclusive, or every re-send to a deduplicating backend was answered
    with no success."""
    BEFORE_COMMIT_HORIZON = "before_commit_horizon"
    """A lookup found nothing before the commit horizon: inconclusive, the key stays claimed."""

    # The authorization server revokes a sign-in (a grant family) and keeps why with it.
    CODE_REUSED = "code_reused"
    """An authorization code was presented again after it was redeemed: its tokens are revoked."""
    REFRESH_TOKEN_REUSED = "refresh_token_reused"
    """A rotated refresh token was presented again: every token of its sign-in is revoked."""
    TOKEN_REVOKED = "token_revoked"
    """The client revoked one of the sign-in's tokens (RFC 7009): every token of it is revoked."""
    LOGIN_USER_REMOVED = "login_user_removed"
    """The sign-in's user is no longer among the built-in login's users: its refresh ended it."""


FORBIDDEN = 403
"""A refusal of the act itself (policy, standing, binding): what a policy's own reason answers with."""

HTTP_STATUS: Mapping[str, int] = MappingProxyType(
    {
        ReasonCode.INVALID_REQUEST: 400,
        ReasonCode.INVALID_COMMAND: 400,
        ReasonCode.INVALID_ARGUMENTS: 400,
        ReasonCode.INVALID_TOKEN: 401,
        ReasonCode.NOT_FOUND: 404,
        ReasonCode.NOT_REVOKED: 404,
        ReasonCode.CAPABILITY_UNKNOWN: 404,
        ReasonCode.CAPABILITY_UNAVAILABLE: 404,
        ReasonCode.REQUEST_TIMEOUT: 408,
        ReasonCode.ALREADY_DECIDED: 409,
        ReasonCode.EXPIRED: 409,
        ReasonCode.NOT_UNRESOLVED: 409,
        ReasonCode.RUN_ALREADY_STOPPED: 409,
        ReasonCode.RUN_NOT_STOPPED: 409,
        ReasonCode.RETRY_NOT_FAILED: 409,
        ReasonCode.ALREADY_RETRIED: 409,
        ReasonCode.IDEMPOTENCY_CONFLICT: 409,
        ReasonCode.CONFIRMATION_USED: 409,
        ReasonCode.CONFIRMATION_EXPIRED: 409,
        ReasonCode.REQUEST_TOO_LARGE: 413,
        ReasonCode.RATE_LIMITED: 429,
    }
)
"""The status of each code that is not simply `FORBIDDEN` (see `http_status`)."""


def http_status(code: ReasonCode | str) -> int:
    """The HTTP status a refusal with `code` answers with; a policy's own reason is forbidden."""
    return HTTP_STATUS.get(code, FORBIDDEN)
