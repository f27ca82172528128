"""Whose records a principal may read: their own, or their whole tenant's with an overseeing role.

One rule for every face (API, console, MCP's writ_call_status and tasks/*): tenants are isolated by
the store's lookups; inside a tenant, an agent reads its own calls, runs and approvals only.
"""

from __future__ import annotations

from policy.model import Principal

OVERSEER_ROLES = frozenset({"approver", "auditor", "admin"})
"""Roles that read every record of their tenant."""


def may_read(who: Principal, owner: str | None) -> bool:
    """Whether `who` may read a record of the tenant that belongs to the subject `owner`."""
    return (owner is not None and who.subject == owner) or bool(who.roles & OVERSEER_ROLES)


AUDIT_ROLES = frozenset({"auditor", "admin"})
"""Roles that export their tenant's whole log."""
