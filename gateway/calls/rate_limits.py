"""Per-principal rate limits on tool calls, counted in the store so that every replica agrees.

Each principal (tenant and subject) draws on one bucket for all its calls, sized by `rate_limits`
(or its tenant's entry), and on one more per capability named under `rate_limits.capabilities`. A
call that finds a bucket empty is answered `denied` / `rate_limited` with when to retry, before
anything is validated, hashed or recorded: a flood costs the log nothing.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from capabilities.contract import Capability
from gateway.errors import ConfigurationError, GatewayError
from policy.model import Principal
from store.rate_limits import Bucket


class RateLimit(BaseModel):
    model_config = ConfigDict(extra="forbid")

    per_s: float = Field(gt=0)
    """Calls per second, sustained."""
    burst: int = Field(ge=1)
    """Calls that may arrive at once after a quiet spell."""


class RateLimitsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    per_s: float = Field(default=20.0, gt=0)
    """Each principal's calls per second, all tools together (an agent's loop rarely needs 5)."""
    burst: int = Field(default=40, ge=1)
    tenants: dict[str, RateLimit] = Field(default_factory=dict)
    """Per tenant: replaces `per_s` and `burst` for every principal of that tenant."""
    capabilities: dict[str, RateLimit] = Field(default_factory=dict)
    """Per tool name: a further limit on each principal's calls of that tool."""


class RateLimited(GatewayError):
    """A bucket the call needs is empty; nothing was recorded or run."""

    def __init__(self, retry_after_s: float) -> None:
        super().__init__(f"rate limited: retry after {retry_after_s:.3f} s")
        self.retry_after_s = retry_after_s


Take = Callable[[Sequence[Bucket], float], float | None]
"""The store's `take_tokens`: None if taken, else the seconds until the call would pass."""


class RateLimiter:
    """Draws each call from its principal's buckets; built by the composition root."""

    def __init__(self, config: RateLimitsConfig, take: Take) -> None:
        self._config = config
        self._take = take

    def check_tools(self, tool_names: Iterable[str]) -> None:
        """Raises:
        ConfigurationError: `rate_limits.capabilities` names a tool no capability has."""
        unknown = sorted(set(self._config.capabilities) - set(tool_names))
        if unknown:
            raise ConfigurationError(
                f"rate_limits.capabilities: no capability has the tool {', '.join(unknown)}"
            )

    def buckets(self, principal: Principal, capability: Capability) -> list[Bucket]:
        if not self._config.enabled:
            return []
        config = self._config
        own = config.tenants.get(principal.tenant) or RateLimit(per_s=config.per_s, burst=config.burst)
        buckets = [Bucket(_key("principal", principal.tenant, principal.subject), own.per_s, own.burst)]
        if limit := config.capabilities.get(capability.tool_name):
            key = _key("capability", principal.tenant, principal.subject, capability.tool_name)
            buckets.append(Bucket(key, limit.per_s, limit.burst))
        return buckets

    def take(self, buckets: Sequence[Bucket], now: datetime) -> None:
        """Take one call from `buckets`, as `buckets` named them (blocking: run it in a worker thread).

        Raises:
            RateLimited: a bucket is empty; `retry_after_s` says when the call would pass.
        """
        if buckets and (wait := self._take(buckets, now.timestamp())) is not None:
            raise RateLimited(wait)


def _key(*parts: str) -> str:
    # Hashed: tenants and subjects are any strings a token carries (long, or holding a NUL that
    # PostgreSQL text cannot). Of their JSON list, so no name can end in a separator and borrow
    # another principal's bucket: ("a", "b|c") and ("a|b", "c") stay apart.
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()
