"""What a principal is shown: the registered capabilities the policy in force could ever allow them.

The MCP face lists and looks up tools, prompts and resources here; the pipeline decides each concrete
call. Both read the same registry and the same policy source, re-read on every use, so a capability is
listed exactly when some call to it could be allowed, and a policy reload shows at once.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from capabilities.contract import Capability
from gateway.calls.authorize import PolicyLike
from gateway.calls.pipeline import RegistryLike
from policy.model import CallContext, Decision, PolicyInput, Principal


class Catalogue:
    def __init__(self, registry: RegistryLike, policy: Callable[[], PolicyLike]) -> None:
        self._registry = registry
        self._policy = policy

    def capability(self, tool_name: str) -> Capability | None:
        """The capability behind a tool name, whether or not anyone may call it."""
        return self._registry.get(tool_name)

    def visible(self, principal: Principal) -> list[Capability]:
        """The capabilities this principal could ever be allowed to call (others are not listed)."""
        policy = self._policy()
        return [c for c in self._registry.capabilities() if policy.may_list(principal, c)]

    def may_list(self, principal: Principal, capability: Capability, uri: str | None = None) -> bool:
        """Whether a relayed prompt (or a resource at `uri`) could ever be got (read) by this principal."""
        return self._policy().may_list(principal, capability, uri)

    def read_decision(
        self, principal: Principal, capability: Capability, uri: str, now: datetime
    ) -> Decision:
        """What policy decides now for this principal reading the resource at `uri` (nothing recorded:
        for a subscription to its updates, which tell of a change and carry no content)."""
        return self._policy().evaluate(PolicyInput(principal, capability, {"uri": uri}, CallContext(now=now)))
