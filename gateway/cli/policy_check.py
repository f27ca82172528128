"""`writ policy check`: a dry run of the policy for one concrete call, for operators.

It builds the configured capabilities and the policy in force, evaluates the call as the pipeline would,
and shows the decision, its reason, the policy version and every rule's verdict. Nothing is recorded and
no backend is contacted.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from capabilities.config import McpBackend
from capabilities.contract import CapabilityError
from capabilities.registry import Registry
from gateway.calls.authorize import decision_record
from gateway.calls.policy_source import policy_provider
from gateway.config import WritConfig
from gateway.errors import ConfigurationError, UnknownTool
from policy.engine import RuleTrace
from policy.model import CallContext, Decision, PolicyError, PolicyInput, Principal


@dataclass(frozen=True, slots=True)
class PolicyCheck:
    decision: Decision
    traces: tuple[RuleTrace, ...]
    capability_ref: str

    def to_json(self) -> dict[str, Any]:
        return {
            "decision": self.decision.effect,
            "reason": self.decision.reason,
            "policy_version": self.decision.policy_version,
            "rule": self.decision.rule_id,
            "capability": self.capability_ref,
            "approval": decision_record(self.decision).to_json()["approval"],
            "message": self.decision.message,
            "rules": [
                {"rule": t.rule_id, "outcome": t.outcome, "decision": t.decision, "problem": t.problem}
                for t in self.traces
            ],
        }

    def to_text(self) -> str:
        d = self.decision
        lines = [
            f"decision: {d.effect}",
            f"reason: {d.reason}",
            f"policy version: {d.policy_version}",
            f"rule: {d.rule_id or '(none: deny by default)'}",
            f"capability: {self.capability_ref}",
        ]
        if d.approval is not None:
            lines.append(
                f"approval: role {d.approval.approver_role}, expires in {d.approval.expires_in_s}s, "
                f"requester may approve: {'yes' if d.approval.requester_may_approve else 'no'}"
            )
        if d.message:
            lines.append(f"message: {d.message}")
        lines.append("rules:")
        width = max((len(t.rule_id) for t in self.traces), default=0)
        for t in self.traces:
            problem = f"  ({t.problem})" if t.problem else ""
            lines.append(f"  {t.rule_id:<{width}}  {t.outcome:<15}  {t.decision}{problem}")
        return "\n".join(lines)


def check_policy(
    config: WritConfig,
    *,
    subject: str,
    roles: Sequence[str],
    tool: str,
    arguments: Mapping[str, Any],
    tenant: str = "default",
    scopes: Sequence[str] = (),
    run_call_count: int = 0,
    now: datetime,
) -> PolicyCheck:
    """Evaluate the policy in force for one call.

    Raises:
        ConfigurationError: the capabilities or the policy do not load.
        UnknownTool: no configured capability has this tool name (upstream MCP tools are only known
            once a running gateway has discovered them).
    """
    base_dir = Path(config.source).parent if config.source else Path.cwd()
    try:
        registry = Registry.from_config(
            config.capabilities_config, environ=dict(os.environ), base_dir=base_dir
        )
        policy = policy_provider(config.policy, config.policy_file, base_dir=base_dir)()
    except (CapabilityError, PolicyError) as exc:
        raise ConfigurationError(f"{config.source or 'config'}: {exc}") from exc
    capability = registry.get(tool)
    if capability is None:
        upstreams = sorted(n for n, b in config.backends.items() if isinstance(b, McpBackend))
        if upstreams:
            # Said plainly: `Unknown tool` for a tool the running gateway serves reads as a typo.
            raise ConfigurationError(
                f"no configured capability is named {tool!r}; tools of MCP backends "
                f"({', '.join(upstreams)}) are listed by the upstream only once a gateway runs, so "
                "writ policy check cannot try them"
            )
        raise UnknownTool(tool)
    principal = Principal(subject=subject, tenant=tenant, roles=frozenset(roles), scopes=frozenset(scopes))
    inp = PolicyInput(
        principal,
        capability,
        arguments,
        CallContext(now=now, run_call_count=run_call_count),
    )
    return PolicyCheck(policy.evaluate(inp), policy.trace(inp), capability.ref)
