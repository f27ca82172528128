"""Builders shared by the policy tests: the demo policy, principals, capabilities and call inputs."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from capabilities.contract import Capability, EffectClass
from policy import CallContext, PolicyInput, Principal

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)

DEMO_POLICY: dict[str, Any] = {
    "rules": [
        {
            "id": "agents-look-up-orders",
            "tools": ["lookup_order"],
            "roles": ["agent"],
            "decision": "allow",
        },
        {
            "id": "agents-refund",
            "tools": ["refund_order"],
            "roles": ["agent"],
            "decision": "allow",
        },
        {
            "id": "refunds-need-approval-over-100",
            "tools": ["refund_order"],
            "roles": ["agent"],
            "when": "args.amount > 100",
            "decision": "require_approval",
            "reason": "amount_over_approval_threshold",
            "approval": {"approver_role": "approver", "expires_in": "1h", "requester_may_approve": False},
        },
        {
            "id": "refunds-over-10000-denied",
            "tools": ["refund_order"],
            "when": "args.amount > 10000",
            "decision": "deny",
            "reason": "amount_over_limit",
            "message": "Refunds over 10000 need a manual process.",
        },
    ]
}


def capability(
    tool: str = "refund_order", *, effect: EffectClass = "write", cap_id: str | None = None
) -> Capability:
    return Capability(
        id=cap_id or tool.replace("_", "-"),
        version="2",
        tool_name=tool,
        backend="shop",
        input_schema={"type": "object"},
        effect=effect,
    )


LOOKUP = capability("lookup_order", effect="read")
REFUND = capability("refund_order", effect="irreversible")


def principal(*roles: str, subject: str = "alice", tenant: str = "acme") -> Principal:
    return Principal(subject=subject, tenant=tenant, roles=frozenset(roles), scopes=frozenset({"tools"}))


AGENT = principal("agent")


def call(
    cap: Capability = REFUND,
    who: Principal = AGENT,
    now: datetime = NOW,
    run_call_count: int = 0,
    **arguments: Any,
) -> PolicyInput:
    return PolicyInput(
        principal=who,
        capability=cap,
        arguments=arguments,
        context=CallContext(now=now, run_call_count=run_call_count),
    )


def call_with(arguments: Mapping[str, Any], cap: Capability = REFUND, who: Principal = AGENT) -> PolicyInput:
    return PolicyInput(principal=who, capability=cap, arguments=arguments, context=CallContext(now=NOW))
