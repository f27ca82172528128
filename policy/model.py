"""The values policy reasons about. Pure data: no I/O, no clock (now is passed in)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from capabilities.contract import Capability

Effect = Literal["allow", "deny", "require_approval"]


class PolicyError(Exception):
    """Root of the errors raised by this package (bad rules, bad expressions)."""


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling, as established from a verified token."""

    subject: str
    tenant: str = "default"
    roles: frozenset[str] = frozenset()
    scopes: frozenset[str] = frozenset()
    client_id: str | None = None
    groups: frozenset[str] = frozenset()

    def to_json(self) -> dict[str, Any]:
        return {
            "subject": self.subject,
            "tenant": self.tenant,
            "roles": sorted(self.roles),
            "scopes": sorted(self.scopes),
            "client_id": self.client_id,
            "groups": sorted(self.groups),
        }


@dataclass(frozen=True, slots=True)
class CallContext:
    """Facts about the situation of the call that rules may use."""

    now: datetime
    run_call_count: int = 0
    """Calls recorded earlier in the same run."""


@dataclass(frozen=True, slots=True)
class PolicyInput:
    principal: Principal
    capability: Capability
    arguments: Mapping[str, Any]
    context: CallContext


@dataclass(frozen=True, slots=True)
class ApprovalRequirement:
    approver_role: str
    expires_in_s: int = 3600
    requester_may_approve: bool = False


@dataclass(frozen=True, slots=True)
class Decision:
    effect: Effect
    reason: str
    """A stable reason code, e.g. `amount_over_limit`, `no_matching_rule`."""
    policy_version: str
    rule_id: str | None = None
    approval: ApprovalRequirement | None = None
    message: str | None = field(default=None, compare=False)
    """Human text explaining the decision: the deciding rule's `message` (the operator's words for the
    user), or Writ's own for `no_matching_rule` and `policy_error`; None when the rule has none."""
    also_matched: tuple[str, ...] = field(default=(), compare=False)
    """The other rules that matched, less restrictive or later in the file than `rule_id`."""
