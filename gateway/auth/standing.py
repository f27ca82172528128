"""A principal's current standing, checked on every path that acts or reads with authority.

A verified token says who someone was when it was issued; a revocation recorded since (in the store,
per tenant) ends every power the token carried: calls, listings, reads, decisions, resolutions and
standing changes, on every face (MCP, API, console, the CLI with a token).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio.to_thread

from policy.model import Principal

if TYPE_CHECKING:
    from store.ports import Standing


def revoked_text(who: Principal) -> str:
    return f"{who.subject} is revoked in tenant {who.tenant}; an admin can restore them"


def is_revoked_now(store: Standing, who: Principal) -> bool:
    """Whether `who` is revoked in their tenant now (blocking: the CLI, or inside a worker thread)."""
    return store.is_revoked(who.tenant, who.subject)


async def is_revoked(store: Standing, who: Principal) -> bool:
    """Whether `who` is revoked in their tenant now."""
    return await anyio.to_thread.run_sync(is_revoked_now, store, who)
