"""What an admin sees and ends of the OAuth clients signed in at Writ's authorization server: each
client with its sign-ins (grant families), and `oauth.client_revoked`, which ends them all at once.

A sign-in is live while it can still yield an access token that works: it is not revoked, and it
holds a refresh token neither used nor expired, or it issued an access token recently enough (after
`live_after`, which the caller sets to now minus the access token and code lifetimes). Revoking a
client ends every unrevoked sign-in of it in the tenant, live or not, in the transaction that records
the event: its refresh tokens are refused from then on, and its access tokens at their next use (the
gateway asks whether a token's sign-in was revoked on every request).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy import Connection, Row, case, func, select, update

from store import events as ev
from store.log import Append
from store.model import NotFound
from store.schema import oauth_clients, oauth_families, oauth_refresh_tokens

ClientKind = Literal["registered", "metadata_document", "unknown"]


@dataclass(frozen=True, slots=True)
class Liveness:
    """How long after its last token a sign-in without a refresh token may still hold a working access
    token: the access token lifetime, plus the code's (it may be redeemed that late)."""

    access_token_ttl_s: int
    code_ttl_s: int

    def live_after(self, now: datetime) -> datetime:
        return now - timedelta(seconds=self.access_token_ttl_s + self.code_ttl_s)


@dataclass(frozen=True, slots=True)
class SignIn:
    """One sign-in of a client: who, when, and until when its refresh token runs."""

    family_id: str
    client_id: str
    tenant: str
    subject: str
    signed_in_at: datetime
    last_refreshed_at: datetime | None
    refresh_expires_at: datetime | None
    """When its current (unused) refresh token expires; None if it holds none."""

    def to_json(self) -> dict[str, Any]:
        """As the API, the CLI's --json and the console show it."""
        return {
            "signInId": self.family_id,
            "subject": self.subject,
            "tenant": self.tenant,
            "signedInAt": _iso(self.signed_in_at),
            "lastRefreshedAt": _iso(self.last_refreshed_at),
            "refreshExpiresAt": _iso(self.refresh_expires_at),
        }


@dataclass(frozen=True, slots=True)
class ClientSummary:
    client_id: str
    name: str | None
    """The client's own name for itself (`client_name` of its metadata), if it gave one."""
    kind: ClientKind
    registered_at: datetime | None
    """When it registered, or when its metadata document was last fetched."""
    live_sign_ins: int
    last_sign_in_at: datetime | None

    def to_json(self) -> dict[str, Any]:
        return {
            "clientId": self.client_id,
            "name": self.name,
            "kind": self.kind,
            "registeredAt": _iso(self.registered_at),
            "liveSignIns": self.live_sign_ins,
            "lastSignInAt": _iso(self.last_sign_in_at),
        }


@dataclass(frozen=True, slots=True)
class ClientDetail:
    client: ClientSummary
    redirect_uris: tuple[str, ...]
    sign_ins: tuple[SignIn, ...]
    """The live ones, newest first."""

    def to_json(self) -> dict[str, Any]:
        return self.client.to_json() | {
            "redirectUris": list(self.redirect_uris),
            "signIns": [s.to_json() for s in self.sign_ins],
        }


@dataclass(frozen=True, slots=True)
class RevokeClient:
    client_id: str
    tenant: str
    revoked_by: str
    now: datetime
    reason: str | None = None
    break_glass: bool = False


@dataclass(frozen=True, slots=True)
class ClientRevocation:
    client_id: str
    tenant: str
    revoked_by: str
    revoked_at: datetime
    sign_ins_ended: int
    reason: str | None
    break_glass: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "clientId": self.client_id,
            "tenant": self.tenant,
            "revokedAt": self.revoked_at.isoformat(),
            "revokedBy": self.revoked_by,
            "reason": self.reason,
            "signInsEnded": self.sign_ins_ended,
            "breakGlass": self.break_glass,
        }


def list_clients(
    conn: Connection, *, tenant: str | None, now: datetime, live_after: datetime
) -> list[ClientSummary]:
    """Every client that signed someone in (in `tenant`, or anywhere), most live sign-ins first."""
    return [d.client for d in describe_clients(conn, tenant=tenant, now=now, live_after=live_after)]


def describe_clients(
    conn: Connection, *, tenant: str | None, now: datetime, live_after: datetime
) -> list[ClientDetail]:
    """`list_clients` with each client's live sign-ins, in two queries however many clients there are."""
    by_client: dict[str, list[Row[Any]]] = {}
    for row in conn.execute(_families(conn, tenant=tenant)):
        by_client.setdefault(row.client_id, []).append(row)
    records = _records(conn, list(by_client))
    details = [
        _detail(client_id, records.get(client_id), rows, now=now, live_after=live_after)
        for client_id, rows in by_client.items()
    ]
    epoch = datetime.min.replace(tzinfo=now.tzinfo)
    details.sort(
        key=lambda d: (
            -d.client.live_sign_ins,
            -(d.client.last_sign_in_at or epoch).timestamp(),
            d.client.client_id,
        )
    )
    return details


def show_client(
    conn: Connection, client_id: str, *, tenant: str | None, now: datetime, live_after: datetime
) -> ClientDetail:
    """A client and its live sign-ins.

    Raises:
        NotFound: no such client signed anyone in (in `tenant`), and none is registered by that id.
    """
    rows = list(conn.execute(_families(conn, tenant=tenant).where(oauth_families.c.client_id == client_id)))
    record = _records(conn, [client_id]).get(client_id)
    if not rows and (record is None or tenant is not None):
        where = f" in tenant {tenant}" if tenant is not None else ""
        raise NotFound(f"no OAuth client {client_id} has signed anyone in{where}")
    return _detail(client_id, record, rows, now=now, live_after=live_after)


def _detail(
    client_id: str, record: Row[Any] | None, rows: list[Row[Any]], *, now: datetime, live_after: datetime
) -> ClientDetail:
    live = [_sign_in(r) for r in rows if _live(r, now=now, live_after=live_after)]
    live.sort(key=lambda s: s.signed_in_at, reverse=True)
    metadata = json.loads(record.metadata) if record is not None else {}
    uris = metadata.get("redirect_uris")
    return ClientDetail(
        client=_summary(client_id, record, rows, now=now, live_after=live_after),
        redirect_uris=tuple(str(u) for u in uris) if isinstance(uris, list) else (),
        sign_ins=tuple(live),
    )


def revoke_client(conn: Connection, cmd: RevokeClient, *, producer: str) -> ClientRevocation:
    """End every sign-in of the client in the tenant and append `oauth.client_revoked` (a repeated
    revocation, ending nothing, is recorded too: it is what the admin did).

    Raises:
        NotFound: no such client signed anyone in the tenant (nothing is recorded).
    """
    log = Append(conn)
    known = conn.execute(
        select(oauth_families.c.family_id)
        .where(oauth_families.c.client_id == cmd.client_id, oauth_families.c.tenant == cmd.tenant)
        .limit(1)
    ).first()
    if known is None:
        raise NotFound(f"no OAuth client {cmd.client_id} has signed anyone in in tenant {cmd.tenant}")
    ended = conn.execute(
        update(oauth_families)
        .where(
            oauth_families.c.client_id == cmd.client_id,
            oauth_families.c.tenant == cmd.tenant,
            oauth_families.c.revoked_at.is_(None),
        )
        .values(revoked_at=cmd.now, revoked_reason="client_revoked")
    ).rowcount
    record = _records(conn, [cmd.client_id]).get(cmd.client_id)
    log.add(
        ev.OAuthClientRevokedEvent(
            occurred_at=ev.format_ts(cmd.now),
            producer=producer,
            tenant=cmd.tenant,
            payload=ev.OAuthClientRevoked(
                client_id=cmd.client_id,
                client_name=_name(record),
                revoked_by=cmd.revoked_by,
                sign_ins_ended=int(ended),
                reason=cmd.reason,
                break_glass=cmd.break_glass,
            ),
        )
    )
    log.flush()
    return ClientRevocation(
        cmd.client_id, cmd.tenant, cmd.revoked_by, cmd.now, int(ended), cmd.reason, cmd.break_glass
    )


def _families(conn: Connection, *, tenant: str | None) -> Any:
    """Families (revoked ones too) with their refresh tokens' times: the last rotation and the live
    token's end."""
    tokens = oauth_refresh_tokens.c
    refreshes = (
        select(
            tokens.family_id,
            func.max(tokens.issued_at).label("last_refreshed_at"),
            func.max(case((tokens.used_at.is_(None), tokens.expires_at))).label("refresh_expires_at"),
        )
        .group_by(tokens.family_id)
        .subquery()
    )
    families = oauth_families.c
    query = select(
        families.family_id,
        families.client_id,
        families.tenant,
        families.subject,
        families.created_at,
        families.revoked_at,
        refreshes.c.last_refreshed_at,
        refreshes.c.refresh_expires_at,
    ).select_from(oauth_families.outerjoin(refreshes, refreshes.c.family_id == families.family_id))
    return query if tenant is None else query.where(families.tenant == tenant)


def _live(row: Row[Any], *, now: datetime, live_after: datetime) -> bool:
    if row.revoked_at is not None:
        return False
    if row.refresh_expires_at is not None and row.refresh_expires_at > now:
        return True
    last = max(row.created_at, row.last_refreshed_at or row.created_at)
    return bool(last > live_after)


def _sign_in(row: Row[Any]) -> SignIn:
    return SignIn(
        family_id=row.family_id,
        client_id=row.client_id,
        tenant=row.tenant,
        subject=row.subject,
        signed_in_at=row.created_at,
        last_refreshed_at=row.last_refreshed_at,
        refresh_expires_at=row.refresh_expires_at,
    )


def _records(conn: Connection, client_ids: list[str]) -> dict[str, Row[Any]]:
    if not client_ids:
        return {}
    rows = conn.execute(select(oauth_clients).where(oauth_clients.c.client_id.in_(client_ids)))
    return {row.client_id: row for row in rows}


def _name(record: Row[Any] | None) -> str | None:
    if record is None:
        return None
    name = json.loads(record.metadata).get("client_name")
    return name if isinstance(name, str) and name.strip() else None


def _summary(
    client_id: str, record: Row[Any] | None, rows: list[Row[Any]], *, now: datetime, live_after: datetime
) -> ClientSummary:
    kind: ClientKind = "unknown"
    if record is not None:
        kind = "registered" if record.document_fresh_until is None else "metadata_document"
    return ClientSummary(
        client_id=client_id,
        name=_name(record),
        kind=kind,
        registered_at=record.issued_at if record is not None else None,
        live_sign_ins=sum(1 for r in rows if _live(r, now=now, live_after=live_after)),
        last_sign_in_at=max((r.created_at for r in rows), default=None),
    )


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None
