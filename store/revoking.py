"""Principal standing: `principal.revoked` and `principal.restored` events, and the `revocations`
projection every later call, resume and authorised read checks (DESIGN §3.4: current standing)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from sqlalchemy import Connection, select, union

from store import events as ev
from store.commands import RestorePrincipal, RevokePrincipal
from store.console_sessions import end_principal_sessions
from store.log import Append, lock_heads
from store.model import NotFound
from store.oauth import revoke_principal_grants
from store.partitions import scheme_of
from store.schema import approvals, revocations, runs, tool_calls


@dataclass(frozen=True, slots=True)
class Revocation:
    tenant: str
    subject: str
    revoked_at: datetime
    revoked_by: str
    reason: str | None
    grants_revoked: int | None = None
    """Sign-ins at Writ's authorization server this revocation ended (set on the revoke that did)."""


def revoke(conn: Connection, cmd: RevokePrincipal, *, producer: str) -> Revocation:
    """Append `principal.revoked` (a repeated one is recorded too), revoke the subject's sign-ins at
    the authorization server (their refresh tokens and access tokens) and end their console sessions;
    return the revocation.

    It holds the head of every partition of the tenant to its COMMIT. With buckets
    (`store.log.buckets`), the subject's calls append under their run's bucket, each reading the
    subject's standing under that bucket's head: a call in flight in any bucket commits before the
    revocation, or waits for it and is refused.
    """
    lock_heads(conn, scheme_of(conn.engine).tenant_partitions(cmd.tenant))
    log = Append(conn)
    grants = revoke_principal_grants(conn, cmd.tenant, cmd.subject, reason="principal_revoked", now=cmd.now)
    end_principal_sessions(conn, cmd.tenant, cmd.subject)
    log.add(
        ev.PrincipalRevokedEvent(
            occurred_at=ev.format_ts(cmd.now),
            producer=producer,
            tenant=cmd.tenant,
            payload=ev.PrincipalRevoked(
                subject=cmd.subject,
                revoked_by=cmd.revoked_by,
                reason=cmd.reason,
                break_glass=cmd.break_glass,
                grants_revoked=grants,
            ),
        )
    )
    log.flush()
    found = get(conn, cmd.tenant, cmd.subject)
    assert found is not None
    return replace(found, grants_revoked=grants)


def restore(conn: Connection, cmd: RestorePrincipal, *, producer: str) -> Revocation:
    """Append `principal.restored` and end every sign-in of the subject still live; return the
    revocation it lifted.

    A sign-in live now began before the revocation committed and reached the store after it (the
    revocation ended every one it saw): it was made while the principal was revoked and is no more
    the restored principal's than the ones the revocation ended. A restored principal signs in again.

    Raises:
        NotFound: the subject is not revoked in the tenant (nothing is recorded).
    """
    log = Append(conn)  # the head lock first, so two restores cannot both find the revocation
    lifted = get(conn, cmd.tenant, cmd.subject)
    if lifted is None:
        raise NotFound(f"{cmd.subject} is not revoked in tenant {cmd.tenant}")
    revoke_principal_grants(conn, cmd.tenant, cmd.subject, reason="principal_revoked", now=cmd.now)
    log.add(
        ev.PrincipalRestoredEvent(
            occurred_at=ev.format_ts(cmd.now),
            producer=producer,
            tenant=cmd.tenant,
            payload=ev.PrincipalRestored(
                subject=cmd.subject,
                restored_by=cmd.restored_by,
                reason=cmd.reason,
                break_glass=cmd.break_glass,
            ),
        )
    )
    log.flush()
    return lifted


def get(conn: Connection, tenant: str, subject: str) -> Revocation | None:
    row = conn.execute(
        select(revocations).where(revocations.c.tenant == tenant, revocations.c.subject == subject)
    ).one_or_none()
    if row is None:
        return None
    return Revocation(row.tenant, row.subject, row.revoked_at, row.revoked_by, row.reason)


def tenants_of(conn: Connection, subject: str) -> list[str]:
    """The tenants where `subject` started a run, made a call, or requested or decided an approval."""
    seen = union(
        select(runs.c.tenant).where(runs.c.subject == subject),
        select(tool_calls.c.tenant).where(tool_calls.c.subject == subject),
        select(approvals.c.tenant).where(approvals.c.requester == subject),
        select(approvals.c.tenant).where(approvals.c.decided_by == subject),
        select(revocations.c.tenant).where(revocations.c.subject == subject),
    ).subquery()
    return sorted(conn.execute(select(seen.c.tenant)).scalars())
