"""`writ calls retry`: a person re-runs a call that failed, as a new call through the same pipeline.

One service behind `POST /api/calls/{id}/retry` and `writ calls retry`. Only a settled failure is
retried (`failed`, or `confirmed_failure` by reconciliation or a person); a completed, pending or
unknown call is refused `retry_not_failed`: unknown is not failed (DESIGN §3.3), and its lookup or a
person settles it first. The retry is a new call, in the original's run, for the original's principal
and arguments; policy, the principal's standing, budgets, loops and a stopped run decide it now, and
approvals follow if the policy asks. Its key is the original's own when the capability declares its
backend deduplicates on the key (as reconciliation's re-send decides); otherwise a new key,
`<original key>:retry-<n>`, so the backend sees a new request. The store records
`tool_call.retry_requested` on the original (who, why, which call, which key) in the transaction that
admits or refuses the retry, checking again under the head lock that it is failed, retried by nobody
before and that the person asking is not revoked.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Protocol

from capabilities.contract import Capability
from gateway.calls.actions import is_action_hash
from gateway.calls.authorize import principal_of_record
from gateway.calls.pipeline import CallInput, CallReport, Retrying
from gateway.errors import Refused
from gateway.reasons import ReasonCode
from store.limits import text_unfit
from store.model import KeySource, RetryLink, RetryRefused, StoredEvent
from store.ports import CallReads

RETRY_ROLES = frozenset({"approver", "admin"})
"""Roles that retry the failed calls of their tenant."""
MAX_REASON = 2000
RETRY_REQUESTED = "tool_call.retry_requested"
MAX_KEY = 255
"""What the MCP edge lets a client's key be (`gateway.mcp.server`); the store's column holds 256."""


class Calling(Protocol):
    async def call(self, inp: CallInput) -> CallReport: ...


class Capabilities(Protocol):
    def in_force(self, tool_name: str, capability_id: str) -> Capability | None: ...


@dataclass(frozen=True, slots=True)
class RetryRequest:
    """One retry: of which call, by whom, why, and what they may do.

    `roles` and `tenant` are a verified principal's; both None for a break-glass operator at the CLI.
    """

    tool_call_id: str
    by: str
    reason: str
    roles: frozenset[str] | None
    tenant: str | None

    @property
    def break_glass(self) -> bool:
        return self.roles is None


async def retry_call(
    req: RetryRequest, *, store: CallReads, registry: Capabilities, pipeline: Calling
) -> CallReport:
    """Re-run the failed call `req` names as a new call (see the module); its report.

    Raises:
        Refused: not allowed, not found, not failed, retried before, or not retryable as recorded.
    """
    _check_request(req)
    call = store.get_call(req.tool_call_id, tenant=req.tenant)
    if call is None:
        raise Refused(ReasonCode.NOT_FOUND, f"no tool call {req.tool_call_id}")
    if call.status != "failed" or call.contradicted:
        state = "contradicted (later evidence disagrees)" if call.contradicted else call.status
        raise Refused(
            ReasonCode.RETRY_NOT_FAILED,
            f"call {call.tool_call_id} is {state}; only a failed call is retried"
            + ("; settle it first (`writ calls resolve`)" if call.status == "result_unknown" else ""),
        )
    events = store.events(tool_call_id=call.tool_call_id)
    for e in events:
        if e.type == RETRY_REQUESTED:
            retry = e.payload.get("retry_tool_call_id")
            raise Refused(ReasonCode.ALREADY_RETRIED, f"call {call.tool_call_id} was retried as {retry}")
    capability = registry.in_force(call.tool_name, call.capability_id)
    if capability is None:
        raise Refused(ReasonCode.CAPABILITY_UNAVAILABLE, f"no capability serves {call.tool_name} now")
    withheld = sorted(set(capability.redact) & set(call.arguments))
    if withheld or call.principal is None:
        why = f"fields {', '.join(withheld)} are stored redacted" if withheld else "no principal recorded"
        raise Refused(ReasonCode.ARGUMENTS_UNAVAILABLE, f"the call cannot be sent again as it was: {why}")
    principal = principal_of_record(call.principal)
    if not is_action_hash(call.action_hash, capability, call.arguments, principal):
        raise Refused(
            ReasonCode.CAPABILITY_CHANGED,
            f"{capability.ref} changed since the call; it is another action now",
        )
    number = _retry_number(events) + 1
    same_key = capability.dedupes_on_key
    key = call.idempotency_key if same_key else retry_key(call.idempotency_key, number)
    key_source: KeySource = "client" if call.key_source == "client" else "derived"
    link = RetryLink(call.tool_call_id, number, req.by, req.reason, req.break_glass, same_key)
    inp = CallInput(
        principal=principal,
        tool_name=call.tool_name,
        arguments=dict(call.arguments),
        idempotency_key=key,
        correlation_id=call.correlation_id,
        kind=capability.kind,
        retry=Retrying(link, call.run_id, key_source),
    )
    try:
        return await pipeline.call(inp)
    except RetryRefused as exc:  # the store's check under the head lock, after a concurrent change
        raise Refused(exc.reason, exc.detail) from exc


def retry_key(key: str, number: int) -> str:
    """The key of retry `number` of a call under `key` (the suffix of the retry it retries replaced,
    not stacked): `<key>:retry-<n>`, or a digest of the key in its place when that would pass the 255
    characters a key may have. Never `key` itself: a client's own key may end in `:retry-1`."""
    earlier = f":retry-{number - 1}"
    root = key[: -len(earlier)] if number > 1 and key.endswith(earlier) else key
    suffix = f":retry-{number}"
    if len(root) + len(suffix) > MAX_KEY:
        root = "sha256-" + hashlib.sha256(root.encode()).hexdigest()
    return root + suffix


def _check_request(req: RetryRequest) -> None:
    if req.roles is not None and not req.roles & RETRY_ROLES:
        raise Refused(ReasonCode.INSUFFICIENT_ROLE, "Retrying a call needs the approver or admin role")
    if not req.reason.strip():
        raise Refused(ReasonCode.INVALID_REQUEST, "a retry needs a reason (recorded with who asked)")
    if len(req.reason) > MAX_REASON:
        raise Refused(ReasonCode.INVALID_REQUEST, f"the reason is over {MAX_REASON} characters")
    if (why := text_unfit(req.reason)) is not None:
        raise Refused(ReasonCode.INVALID_REQUEST, f"the reason {why}")


def _retry_number(events: list[StoredEvent]) -> int:
    """Which retry the call itself is (0 for a first call), from its own request."""
    for e in events:
        if e.type == "tool_call.requested":
            return int(e.payload.get("retry_number") or 0)
    return 0


def retry_links(events: list[StoredEvent]) -> dict[str, object]:
    """What `calls show` and `GET /api/calls/{id}` add about retries, from one call's events: the
    call it retries, and the retry it was re-run as (who asked, why)."""
    links: dict[str, object] = {}
    for e in events:
        if e.type == "tool_call.requested" and e.payload.get("retry_of"):
            links["retryOf"] = e.payload["retry_of"]
            links["retryNumber"] = e.payload.get("retry_number")
        elif e.type == RETRY_REQUESTED:
            links["retriedAs"] = e.payload.get("retry_tool_call_id")
            links["retriedBy"] = e.payload.get("requested_by")
            links["retryReason"] = e.payload.get("reason")
            links["retryKey"] = e.payload.get("idempotency_key")
    return links
