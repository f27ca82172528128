"""`writ policy check`: a dry run of the policy for one concrete call, for operators.

It builds the configured capabilities and the policy in force, evaluates the call as the pipeline would,
and shows the decision, its reason, the policy version, every rule's verdict and the budgets the call
would count against. Nothing is recorded and no backend is contacted.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from capabilities.config import McpBackend
from capabilities.contract import Capability, CapabilityError
from capabilities.mcp_relays import resource_capability, upstream_uri
from capabilities.registry import Registry
from gateway.calls.authorize import decision_record
from gateway.calls.budgets import MICROS, counter_key
from gateway.calls.policy_source import policy_provider
from gateway.config import WritConfig
from gateway.errors import ConfigurationError, UnknownTool
from policy.budgets import BudgetCharge
from policy.cel import ExpressionError
from policy.engine import POLICY_ERROR, Policy, RuleTrace
from policy.model import CallContext, Decision, PolicyError, PolicyInput, Principal
from policy.naming import tool_names, unmatched_tools


@dataclass(frozen=True, slots=True)
class PolicyCheck:
    decision: Decision
    traces: tuple[RuleTrace, ...]
    capability_ref: str
    charges: tuple[BudgetCharge, ...] = ()
    """The budgets the call would count against (none when policy denies it anyway)."""
    used: tuple[Decimal, ...] | None = None
    """What each of `charges`' counters holds now, in the store; None where it could not be read."""
    use_note: str | None = None
    """Why `used` is None, or where it was read."""
    tool_names: tuple[str, ...] = ()
    """What `writ serve` says at start of the policy's `tools` entries that name no capability."""

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
            "budgets": [
                {
                    "budget": c.budget_id,
                    "scope": c.scope,
                    "counter": list(c.scope_parts),
                    "amount": str(c.amount),
                    "limit": str(c.limit),
                    "window_start": c.window_start.isoformat() if c.window_start else None,
                    "resets_at": c.resets_at.isoformat() if c.resets_at else None,
                    "used": None if self.used is None else str(self.used[n]),
                    "would_exceed": None if self.used is None else self.used[n] + c.amount > c.limit,
                }
                for n, c in enumerate(self.charges)
            ],
            "budget_use": self.use_note,
            "tool_names": list(self.tool_names),
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
        lines.extend(f"tool names: {said}" for said in self.tool_names)
        lines.append("rules:")
        width = max((len(t.rule_id) for t in self.traces), default=0)
        for t in self.traces:
            problem = f"  ({t.problem})" if t.problem else ""
            lines.append(f"  {t.rule_id:<{width}}  {t.outcome:<15}  {t.decision}{problem}")
        lines.append("budgets:" if self.charges else "budgets: (none apply)")
        for n, c in enumerate(self.charges):
            resets = f"resets {c.resets_at.isoformat()}" if c.resets_at else "per run"
            counter = "/".join(c.scope_parts)
            use = ""
            if self.used is not None:
                over = "  WOULD EXCEED: refused budget_exceeded" if self.used[n] + c.amount > c.limit else ""
                use = f"  used {self.used[n]:f}{over}"
            lines.append(f"  {c.budget_id}  {c.scope} {counter}  +{c.amount} of {c.limit}  {resets}{use}")
        if self.charges and self.use_note:
            lines.append(f"budget use: {self.use_note}")
        return "\n".join(lines)

    def with_use(self, used: Mapping[str, int] | None, note: str) -> PolicyCheck:
        """This check with what each counter holds (`used`: micro-units by counter key, from the store)."""
        if used is None:
            return replace(self, used=None, use_note=note)
        micros = [used.get(counter_key(c), 0) for c in self.charges]
        return replace(self, used=tuple(Decimal(m) / MICROS for m in micros), use_note=note)


def check_policy(
    config: WritConfig,
    *,
    subject: str,
    roles: Sequence[str],
    tool: str | None,
    arguments: Mapping[str, Any],
    resource: str | None = None,
    tenant: str = "default",
    scopes: Sequence[str] = (),
    run_call_count: int = 0,
    run_id: str | None = None,
    now: datetime,
) -> PolicyCheck:
    """Evaluate the policy in force for one call: of `tool`, or a read of the relayed `resource`
    (whose argument is its URI; the other arguments are then ignored).

    Raises:
        ConfigurationError: the capabilities or the policy do not load, or no backend relays `resource`.
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
    if resource is not None:
        capability = _resource_capability(config, resource)
        arguments = {"uri": resource}
    else:
        capability = _tool_capability(config, registry, tool or "")
    principal = Principal(subject=subject, tenant=tenant, roles=frozenset(roles), scopes=frozenset(scopes))
    inp = PolicyInput(
        principal,
        capability,
        arguments,
        CallContext(now=now, run_call_count=run_call_count),
    )
    decision = policy.evaluate(inp)
    charges: tuple[BudgetCharge, ...] = ()
    if decision.effect != "deny":
        try:
            # Unless a run is named (Writ's id), a run budget's counter shows as "(run)".
            charges = policy.charges(inp, run_id or "(run)")
        except ExpressionError as exc:
            # As the pipeline does: an amount that cannot be counted denies the call.
            decision = Decision("deny", POLICY_ERROR, decision.policy_version, exc.rule_id, message=str(exc))
    return PolicyCheck(
        decision, policy.trace(inp), capability.ref, charges, tool_names=_names(config, policy, registry)
    )


def _names(config: WritConfig, policy: Policy, registry: Registry) -> tuple[str, ...]:
    """What `writ serve` will say of the policy's tool names (`vet_tool_names`), where it can be known
    without starting: an upstream MCP server's tools are known once a gateway has discovered them."""
    if any(isinstance(backend, McpBackend) for backend in config.backends.values()):
        return ("checked when `writ serve` starts and has discovered its upstreams' tools",)
    return tuple(
        f"{'writ serve refuses to start: ' if u.refuses_start else 'warning: '}{u}"
        for u in unmatched_tools(policy.config, tool_names(registry.capabilities()))
    )


def _tool_capability(config: WritConfig, registry: Registry, tool: str) -> Capability:
    """The configured capability of this tool name.

    Raises:
        ConfigurationError: no such tool, and MCP backends could list it once a gateway runs.
        UnknownTool: no such tool.
    """
    capability = registry.get(tool)
    if capability is not None:
        return capability
    upstreams = sorted(n for n, b in config.backends.items() if isinstance(b, McpBackend))
    if upstreams:
        # Said plainly: `Unknown tool` for a tool the running gateway serves reads as a typo.
        raise ConfigurationError(
            f"no configured capability is named {tool!r}; tools of MCP backends "
            f"({', '.join(upstreams)}) are listed by the upstream only once a gateway runs, so "
            "writ policy check cannot try them"
        )
    raise UnknownTool(tool)


def _resource_capability(config: WritConfig, uri: str) -> Capability:
    """The resource capability of the backend whose `uri_prefix` the URI starts with (known from the
    config alone: no upstream is asked whether it has the resource).

    Raises:
        ConfigurationError: no backend relays resources under this URI.
    """
    for name, backend in config.backends.items():
        if not isinstance(backend, McpBackend) or backend.resources is None:
            continue
        if upstream_uri(backend.resources.uri_prefix, uri) is not None:
            return resource_capability(name, backend)
    raise ConfigurationError(f"no backend relays resources under {uri!r} (see resources.uri_prefix)")


def budget_use(config: WritConfig, check: PolicyCheck) -> PolicyCheck:
    """`check` with what its budgets' counters hold in the configured store, read without writing.

    A SQLite file that does not exist yet holds nothing (and is not created); a store that cannot be
    read leaves the use unknown, saying why: the dry run never fails for want of a database.
    """
    from sqlalchemy.engine import make_url

    from gateway.opening import missing_sqlite_file, open_store
    from store.model import StoreError

    if not check.charges:
        return check
    if missing_sqlite_file(config.store.url):
        missing = make_url(config.store.url).database
        return check.with_use({}, f"nothing recorded yet ({missing} does not exist)")
    try:
        store = open_store(config, migrate_empty=False)
    except (ConfigurationError, StoreError) as exc:
        return check.with_use(None, f"unknown: {exc}")
    try:
        used = store.budget_use(counter_key(c) for c in check.charges)
    except StoreError as exc:
        return check.with_use(None, f"unknown: {exc}")
    finally:
        store.close()
    return check.with_use(used, "read from the store just now")
