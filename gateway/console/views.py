"""What the console shows of an approval and a call, read from the store (blocking; run in a thread)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from capabilities.contract import Capability
from gateway.calls.actions import is_contract_hash
from gateway.mcp.results import outcome_text, recorded_decision
from policy.model import Principal
from store.model import ApprovalView, CallView, StoredEvent
from store.ports import CallReads

REDACTED_PREFIX = "redacted:"
_DECISIONS = frozenset({"approval.granted", "approval.rejected"})


@dataclass(frozen=True, slots=True)
class InForce:
    """What is in force now, to hold a waiting call against: its capability, the policy's version."""

    capability: Callable[[str, str], Capability | None]
    """The capability a call (by tool name and capability id) would run under now."""
    policy_version: Callable[[], str]


def changes_since_request(call: CallView, now: InForce) -> list[str]:
    """What changed since `call` was requested, as sentences for its approver; empty if nothing did.

    The approver sees the effect as requested, but it runs under the contract and policy in force when
    approved: a change of either means what they approve is not what they see (a changed contract is
    refused at execution; a changed policy decides again).
    """
    changes = []
    capability = now.capability(call.tool_name, call.capability_id)
    if capability is None:
        changes.append(f"The tool {call.tool_name} is no longer offered: this call cannot run.")
    elif (capability.id, capability.version) != (call.capability_id, call.capability_version) or (
        call.contract_hash is not None and not is_contract_hash(call.contract_hash, capability)
    ):
        changes.append(
            f"The capability's contract changed since the call was requested (now {capability.ref}): "
            "approved, it will be refused as capability_changed."
        )
    version = now.policy_version()
    if version != call.policy_version:
        changes.append(
            f"The policy changed since the call was requested (version {call.policy_version}, now "
            f"{version}): approved, it is decided again under the new policy."
        )
    return changes


def approval_card(
    store: CallReads, approval: ApprovalView, who: Principal, now: datetime, in_force: InForce | None = None
) -> dict[str, Any]:
    """Everything a reviewer needs to see the exact effect before deciding."""
    call = store.get_call(approval.tool_call_id)
    events = store.events(tool_call_id=approval.tool_call_id)
    decision = dict(recorded_decision(events) or {})
    arguments = _arguments(call)
    may_decide = approval.status == "awaiting_approval" and approval.approver_role in who.roles
    own = who.subject == approval.requester and not approval.requester_may_approve
    # Whoever asked for the retry the call is may not approve it either (gateway.calls.approvals).
    own_retry = (
        approval.status == "awaiting_approval"  # the note is shown only with the decision form
        and not own
        and not approval.requester_may_approve
        and who.subject == store.retry_requested_by(approval.tool_call_id)
    )
    return {
        "approval": approval,
        "call": call,
        "capability": f"{call.capability_id}@{call.capability_version}" if call else "?",
        "summary": call.summary if call else "",
        "arguments": arguments,
        "rule": decision.get("rule_id"),
        "reason": decision.get("reason"),
        **_policy_words(decision),
        "policy_version": decision.get("policy_version"),
        "expires_at": approval.expires_at.isoformat(),
        "seconds_left": max(int((approval.expires_at - now).total_seconds()), 0),
        "may_decide": may_decide,
        "own_call": own,
        "own_retry": own_retry,
        # From the decision's event, not from the name: a token's subject may read `operator:...` too.
        "break_glass": any(e.type in _DECISIONS and e.payload.get("break_glass") is True for e in events),
        "refused_after_approval": refused_after_approval(approval, call),
        "changes": (
            changes_since_request(call, in_force)
            if in_force is not None and call is not None and approval.status == "awaiting_approval"
            else []
        ),
    }


def refused_after_approval(approval: ApprovalView, call: CallView | None) -> str | None:
    """Why an approved call was refused when it came to run (re-authorized at execution, DESIGN §3.4):
    an approval is not an outcome, so a card that says "approved by bob" says what came of it too."""
    if approval.status != "approved" or call is None or call.status != "denied":
        return None
    return call.reason or "refused"


def status_note(call: CallView) -> str | None:
    """What the bracket after a call's status names: what failed, or was not heard, for a call that
    failed or is unknown; the refusal's reason for a denied one. The policy's decision that let a call
    run is not its outcome's reason: the call page shows that on a line of its own."""
    if call.status in ("failed", "result_unknown"):
        return call.error
    if call.status == "denied":
        return call.reason
    return None


def _policy_words(decision: dict[str, Any]) -> dict[str, Any]:
    """The deciding rule's message and the other rules that matched, each said once."""
    message = decision.get("message")
    also = ", ".join(decision.get("also_matched") or ())
    legacy = f"decided by rule {decision.get('rule_id')!r}"
    if isinstance(message, str) and message.startswith(legacy):
        # Recorded before the two were kept apart: Writ's own sentence, which named the rule again.
        also = message.removeprefix(legacy).strip().removeprefix("(also matched: ").removesuffix(")")
        message = None
    return {"message": message, "also_matched": also}


def unresolved_card(store: CallReads, call: CallView) -> dict[str, Any]:
    """An unknown call as a resolver sees it: the effect, what is known, and each reconciliation try."""
    evidence: list[dict[str, Any]] = []
    attempts: list[dict[str, Any]] = []
    for event in store.events(tool_call_id=call.tool_call_id):
        payload = event.payload
        if event.type == "tool_call.result_unknown":
            known = {k: payload[k] for k in ("error", "detail") if payload.get(k)}
            evidence.append({"at": event.occurred_at, **known, **(payload.get("evidence") or {})})
        elif event.type.startswith("reconciliation."):
            attempts.append(
                {
                    "at": event.occurred_at,
                    "type": event.type.removeprefix("reconciliation."),
                    "facts": {
                        key: payload[key]
                        for key in (
                            "method",
                            "attempt",
                            "attempts",
                            "reason",
                            "detail",
                            "next_attempt_at",
                            "recheck_at",
                            "source",
                            "by",
                            "settled_status",
                            "verdict",
                        )
                        if payload.get(key) not in (None, "")
                    },
                    "evidence": payload.get("evidence") or {},
                    # A contradiction shows the verdict it disagrees with and that verdict's evidence.
                    "settled_evidence": payload.get("settled_evidence") or {},
                }
            )
    return {
        "call": call,
        "outcome": outcome_text(call),
        "capability": f"{call.capability_id}@{call.capability_version}",
        "arguments": _arguments(call),
        "evidence": evidence,
        "attempts": attempts,
    }


def _arguments(call: CallView | None) -> list[dict[str, Any]]:
    return [
        {
            "name": name,
            "value": value,
            "redacted": isinstance(value, str) and value.startswith(REDACTED_PREFIX),
        }
        for name, value in sorted((call.arguments if call else {}).items())
    ]


def timeline(events: Sequence[StoredEvent]) -> list[dict[str, Any]]:
    """The call's events, oldest first, each with the facts worth a line."""
    rows = []
    for event in events:
        payload = event.payload
        facts = {
            key: payload[key]
            for key in (
                "decided_by",
                "resolved_by",
                "verdict",
                "reason",
                "error",
                "detail",
                "attempt",
                "lease_owner",
            )
            if payload.get(key) not in (None, "")
        }
        decision = payload.get("decision")
        if isinstance(decision, dict):
            facts["decision"] = decision.get("effect")
            facts["rule"] = decision.get("rule_id")
        rows.append(
            {
                "break_glass": payload.get("break_glass") is True,
                "seq": event.seq,
                "type": event.type,
                "at": event.occurred_at,
                "producer": event.producer,
                "facts": facts,
            }
        )
    return rows
