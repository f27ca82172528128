"""Principal revocation: a `principal.revoked` event, and the `revocations` projection every later call
and every resume checks (DESIGN §3.4: the principal's current standing)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, select

from store import events as ev
from store.log import Append
from store.schema import revocations


@dataclass(frozen=True, slots=True)
class Revocation:
    tenant: str
    subject: str
    revoked_at: datetime
    revoked_by: str
    reason: str | None


def revoke(
    conn: Connection,
    *,
    tenant: str,
    subject: str,
    revoked_by: str,
    reason: str | None,
    now: datetime,
    producer: str,
) -> Revocation:
    """Append `principal.revoked` (a repeated one is recorded too); return the standing revocation."""
    log = Append(conn)
    log.add(
        ev.PrincipalRevokedEvent(
            occurred_at=ev.format_ts(now),
            producer=producer,
            tenant=tenant,
            payload=ev.PrincipalRevoked(subject=subject, revoked_by=revoked_by, reason=reason),
        )
    )
    log.flush()
    found = get(conn, tenant, subject)
    assert found is not None
    return found


def get(conn: Connection, tenant: str, subject: str) -> Revocation | None:
    row = conn.execute(
        select(revocations).where(revocations.c.tenant == tenant, revocations.c.subject == subject)
    ).one_or_none()
    if row is None:
        return None
    return Revocation(row.tenant, row.subject, row.revoked_at, row.revoked_by, row.reason)
