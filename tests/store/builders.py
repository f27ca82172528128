"""Requests with sensible defaults, so each test states only what it is about."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from store import (
    ApprovalNeed,
    CallIdentity,
    CallRequest,
    DecisionRecord,
    OutcomeRecord,
    PrincipalRecord,
    RefusalRequest,
)
from store.commands import RecordOutcome

NOW = datetime(2026, 11, 30, 12, 0, 0, 123456, tzinfo=UTC)
ALLOW = DecisionRecord("allow", "within_limits", "7", rule_id="small-refunds")
DENY = dataclasses.replace(ALLOW, effect="deny", reason="amount_over_limit", rule_id="max-refund")
REQUIRE_APPROVAL = dataclasses.replace(
    ALLOW, effect="require_approval", reason="amount_over_100", approval=ApprovalNeed("finance", 3600, False)
)


def new_id(prefix: str) -> str:
    """An id in the form the gateway mints (`gateway.calls.actions.new_id`), so that the store's tests
    run on the compact form `store.schema.CallId` keeps such an id in; the tests' own ids, such as
    `tc-1`, are kept as text."""
    return f"{prefix}_{uuid.uuid4().hex[:28]}"


def identity(**changes: Any) -> CallIdentity:
    """Alice of tenant acme asking to refund order 1001 under a client-supplied key."""
    tenant = changes.get("tenant", "acme")
    who = CallIdentity(
        tool_call_id=new_id("tc"),
        run_id="run-1",
        run_origin="client",
        tenant=tenant,
        subject="alice",
        principal=PrincipalRecord("alice", tenant, roles=("agent",), client_id="c"),
        tool_name="refund_order",
        capability_id="refund-order",
        capability_version="2",
        arguments={"order": 1001, "amount": "250.00", "note": "späť"},
        action_hash="action-a",
        idempotency_key="key-1",
        key_source="client",
        correlation_id=new_id("corr"),
        now=NOW,
    )
    return dataclasses.replace(who, **changes)


def _split(changes: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    # Tests name identity fields and request fields alike; each goes where it belongs.
    names = {f.name for f in dataclasses.fields(CallIdentity)}
    return (
        {k: v for k, v in changes.items() if k in names},
        {k: v for k, v in changes.items() if k not in names},
    )


def call_request(**changes: Any) -> CallRequest:
    """A refund call by alice of tenant acme, allowed by policy, with a client-supplied key."""
    who, rest = _split(changes)
    request = CallRequest(
        identity=identity(**who),
        dedupe_window_s=600,
        decision=ALLOW,
        policy_version="7",
        effect_class="write",
        summary="refund 250.00 EUR to order 1001",
        external_request_id=new_id("ext"),
    )
    if rest.get("decision") is REQUIRE_APPROVAL:
        rest.setdefault("approval_id", new_id("ap"))
        rest.setdefault("approval_expires_at", changes.get("now", NOW) + timedelta(hours=1))
    return dataclasses.replace(request, **rest)


def refusal_request(**changes: Any) -> RefusalRequest:
    who, rest = _split(changes)
    request = RefusalRequest(
        identity=identity(
            **{
                "principal": PrincipalRecord("alice", "acme"),
                "arguments": {"order": "not-a-number"},
                "action_hash": "action-bad",
                "idempotency_key": "key-bad",
                "key_source": "derived",
                **who,
            }
        ),
        reason="invalid_arguments",
        detail="order: 'not-a-number' is not of type 'integer'",
        policy_version="7",
    )
    return dataclasses.replace(request, **rest)


def outcome(
    tool_call_id: str,
    kind: Literal["completed", "failed", "unknown"],
    *,
    now: datetime,
    token: int = 1,
    **observed: Any,
) -> RecordOutcome:
    """The outcome of `tool_call_id` as its first dispatch (lease token 1) observed it."""
    return RecordOutcome(tool_call_id, OutcomeRecord(kind=kind, **observed), token=token, now=now)
