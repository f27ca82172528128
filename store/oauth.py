"""The authorization server's records: registered clients, grant families, codes and refresh tokens.

Codes, refresh tokens and client secrets are kept as sha256 digests: a copy of the database redeems
nothing. Every claim on a secret is one conditional UPDATE (`used_at IS NULL`), so two replicas racing
with the same code or refresh token cannot both win: on PostgreSQL the loser waits for the winner's row
lock and then finds the row used; on SQLite writers are serialized. A secret presented after it was used
revokes its whole family (RFC 6749 §4.1.2 for codes, OAuth 2.1 §4.3.1 for refresh tokens) in the same
transaction that finds the reuse, and that revocation is committed before the caller hears the refusal.

A code or refresh token whose principal is revoked now is refused and ends its family, so nothing is
issued to a revoked principal and nothing it held revives when it is restored (`store.revoking`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy import Column, Connection, Engine, Row, Select, Table, delete, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite

from store.canonical import canonical_json
from store.model import StoreError
from store.schema import oauth_clients, oauth_codes, oauth_families, oauth_refresh_tokens, revocations

GrantProblem = Literal["unknown", "expired", "other_client", "reused", "revoked"]
KEEP_EXPIRED = timedelta(hours=1)
"""Expired codes and refresh tokens are kept this long (a late reuse is still recognised), then deleted."""


class GrantRefused(StoreError):
    """A code or refresh token that grants nothing; `problem` says why (for the log, not the client)."""

    def __init__(self, problem: GrantProblem, message: str) -> None:
        super().__init__(message)
        self.problem = problem


def digest(secret: str) -> str:
    """How a secret is kept: its sha256, in hex."""
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True, slots=True)
class Grantee:
    """The principal a grant speaks for, as the login step established it."""

    subject: str
    tenant: str
    roles: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RegisteredClient:
    client_id: str
    metadata: Mapping[str, Any]
    """The RFC 7591 metadata as registered (redirect_uris, client_name, grant_types, ...)."""
    issued_at: datetime
    secret_hash: str | None = None
    """None for a public client (token_endpoint_auth_method `none`)."""
    document_fresh_until: datetime | None = None
    """For a client known by its metadata document (`client_id` is its URL): the fetched document is
    used until then. None for a registered client."""


@dataclass(frozen=True, slots=True)
class CodeGrant:
    """What an authorization code is bound to."""

    family_id: str
    client_id: str
    redirect_uri: str
    scope: str
    resource: str
    code_challenge: str
    code_challenge_method: str
    grantee: Grantee
    expires_at: datetime
    used_at: datetime | None = field(default=None, compare=False)
    nonce: str | None = None
    """The OpenID `nonce` of the authorization request, echoed in the ID token."""
    auth_time: datetime | None = None
    """When the user signed in (OpenID `auth_time`); None for codes issued before it was kept."""


@dataclass(frozen=True, slots=True)
class RefreshGrant:
    """What a refresh token is bound to; each rotation issues a new one in the same family."""

    family_id: str
    client_id: str
    scope: str
    resource: str
    grantee: Grantee
    issued_at: datetime
    expires_at: datetime
    used_at: datetime | None = field(default=None, compare=False)
    auth_time: datetime | None = None
    """When the user signed in to start the family, carried from its code to every refresh token."""


class OAuthRecords:
    """Mixed into `Store`, which provides the engine and the error translation."""

    @property
    def engine(self) -> Engine:
        raise NotImplementedError

    def _errors_translated(self) -> AbstractContextManager[None]:
        raise NotImplementedError

    def _read(self) -> AbstractContextManager[Connection]:
        raise NotImplementedError

    # -- clients ------------------------------------------------------------------------------

    def register_client(self, client: RegisteredClient) -> None:
        with self._errors_translated(), self.engine.begin() as conn:
            conn.execute(
                insert(oauth_clients).values(
                    client_id=client.client_id,
                    secret_hash=client.secret_hash,
                    metadata=canonical_json(dict(client.metadata)),
                    issued_at=client.issued_at,
                )
            )

    def get_client(self, client_id: str) -> RegisteredClient | None:
        with self._read() as conn:
            row = conn.execute(select(oauth_clients).where(oauth_clients.c.client_id == client_id)).first()
        if row is None:
            return None
        return _client(row)

    def keep_client_document(self, client: RegisteredClient) -> None:
        """Keep a client's fetched metadata document (insert, or replace the one kept before), so every
        replica uses it until `document_fresh_until`."""
        values = {
            "metadata": canonical_json(dict(client.metadata)),
            "issued_at": client.issued_at,
            "document_fresh_until": client.document_fresh_until,
            "secret_hash": None,
        }
        with self._errors_translated(), self.engine.begin() as conn:
            upsert = (
                postgresql.insert(oauth_clients)
                if conn.dialect.name == "postgresql"
                else sqlite.insert(oauth_clients)
            )
            statement = upsert.values(client_id=client.client_id, **values)
            conn.execute(statement.on_conflict_do_update(index_elements=["client_id"], set_=values))

    # -- authorization codes ------------------------------------------------------------------

    def issue_code(self, code: str, grant: CodeGrant, *, now: datetime) -> None:
        """Record a new grant family and its code (and forget codes long expired)."""
        with self._errors_translated(), self.engine.begin() as conn:
            conn.execute(delete(oauth_codes).where(oauth_codes.c.expires_at < now - KEEP_EXPIRED))
            conn.execute(
                insert(oauth_families).values(
                    family_id=grant.family_id,
                    client_id=grant.client_id,
                    tenant=grant.grantee.tenant,
                    subject=grant.grantee.subject,
                    created_at=now,
                )
            )
            conn.execute(
                insert(oauth_codes).values(
                    code_hash=digest(code),
                    family_id=grant.family_id,
                    client_id=grant.client_id,
                    redirect_uri=grant.redirect_uri,
                    scope=grant.scope,
                    resource=grant.resource,
                    code_challenge=grant.code_challenge,
                    code_challenge_method=grant.code_challenge_method,
                    grantee=_grantee_json(grant.grantee),
                    expires_at=grant.expires_at,
                    nonce=grant.nonce,
                    auth_time=grant.auth_time,
                )
            )

    def nonce_used(self, client_id: str, nonce: str) -> bool:
        """Whether a code kept for the client was issued for this OpenID `nonce` (a replayed request)."""
        with self._read() as conn:
            found = conn.execute(
                select(oauth_codes.c.code_hash)
                .where(oauth_codes.c.client_id == client_id, oauth_codes.c.nonce == nonce)
                .limit(1)
            ).first()
        return found is not None

    def find_code(self, code: str) -> CodeGrant | None:
        """The code's grant, used or not (None: never issued, or long expired)."""
        with self._read() as conn:
            row = conn.execute(select(oauth_codes).where(oauth_codes.c.code_hash == digest(code))).first()
        return None if row is None else _code(row)

    def redeem_code(self, code: str, *, client_id: str, now: datetime) -> CodeGrant:
        """Use the code, once: the first redemption wins, a later one revokes the code's family.

        Raises:
            GrantRefused: unknown, expired, issued to another client, used before (`reused`: its family
                is revoked, committed before this is raised), or its family was revoked.
        """
        with self._errors_translated(), self.engine.begin() as conn:
            claimed = _use_once(conn, _CODE, code, client_id, now)
        if isinstance(claimed, GrantRefused):
            raise claimed  # after the commit: a reuse's revocation stands
        return _code(claimed)

    # -- refresh tokens -----------------------------------------------------------------------

    def issue_refresh_token(self, token: str, grant: RefreshGrant) -> None:
        """Record a refresh token of an existing family (and forget tokens long expired)."""
        with self._errors_translated(), self.engine.begin() as conn:
            conn.execute(
                delete(oauth_refresh_tokens).where(
                    oauth_refresh_tokens.c.expires_at < grant.issued_at - KEEP_EXPIRED
                )
            )
            conn.execute(
                insert(oauth_refresh_tokens).values(
                    token_hash=digest(token),
                    family_id=grant.family_id,
                    client_id=grant.client_id,
                    scope=grant.scope,
                    resource=grant.resource,
                    grantee=_grantee_json(grant.grantee),
                    issued_at=grant.issued_at,
                    expires_at=grant.expires_at,
                    auth_time=grant.auth_time,
                )
            )

    def find_refresh_token(self, token: str) -> RefreshGrant | None:
        with self._read() as conn:
            row = conn.execute(
                select(oauth_refresh_tokens).where(oauth_refresh_tokens.c.token_hash == digest(token))
            ).first()
        return None if row is None else _refresh(row)

    def use_refresh_token(
        self, token: str, *, client_id: str, now: datetime, signed_in_after: datetime | None = None
    ) -> RefreshGrant:
        """Use the refresh token, once (the caller issues its successor); a second use revokes the family.
        With `signed_in_after`, a token of a family signed in at or before it is refused and left unused.

        Raises:
            GrantRefused: unknown, expired, its sign-in older than `signed_in_after` (`expired`), issued
                to another client, used before (`reused`: the whole family, the newest token included,
                is revoked and committed first), or revoked (its family, or its principal now).
        """
        with self._errors_translated(), self.engine.begin() as conn:
            claimed = _use_once(conn, _REFRESH, token, client_id, now, signed_in_after)
        if isinstance(claimed, GrantRefused):
            raise claimed  # after the commit: a reuse's revocation stands
        return _refresh(claimed)

    # -- families -----------------------------------------------------------------------------

    def revoke_family(self, family_id: str, *, reason: str, now: datetime) -> bool:
        """End a grant family: its codes, refresh tokens and access tokens; False if it already was."""
        with self._errors_translated(), self.engine.begin() as conn:
            return _revoke(conn, family_id, reason=reason, now=now)

    def family_revoked(self, family_id: str) -> bool:
        """Whether the family was revoked (an unknown family counts as revoked: nothing vouches for it)."""
        with self._read() as conn:
            return _family_revoked(conn, family_id)


def revoke_principal_grants(
    conn: Connection, tenant: str, subject: str, *, reason: str, now: datetime
) -> int:
    """Revoke every live grant family of a principal; returns how many (used by `revoking.revoke`)."""
    result = conn.execute(
        update(oauth_families)
        .where(
            oauth_families.c.tenant == tenant,
            oauth_families.c.subject == subject,
            oauth_families.c.revoked_at.is_(None),
        )
        .values(revoked_at=now, revoked_reason=reason)
    )
    return int(result.rowcount)


def _revoke(conn: Connection, family_id: str, *, reason: str, now: datetime) -> bool:
    result = conn.execute(
        update(oauth_families)
        .where(oauth_families.c.family_id == family_id, oauth_families.c.revoked_at.is_(None))
        .values(revoked_at=now, revoked_reason=reason)
    )
    return bool(result.rowcount)


def _family_revoked(conn: Connection, family_id: str) -> bool:
    row = conn.execute(
        select(oauth_families.c.revoked_at).where(oauth_families.c.family_id == family_id)
    ).first()
    return row is None or row.revoked_at is not None


@dataclass(frozen=True, slots=True)
class _Secret:
    """One kind of once-only secret: where it is kept, how refusals name it and its reuse."""

    table: Table
    hashed: Column[Any]
    what: str
    reason: str


_CODE = _Secret(oauth_codes, oauth_codes.c.code_hash, "code", reason="code_reused")
_REFRESH = _Secret(
    oauth_refresh_tokens, oauth_refresh_tokens.c.token_hash, "refresh token", reason="refresh_token_reused"
)


def _use_once(
    conn: Connection,
    kind: _Secret,
    secret: str,
    client_id: str,
    now: datetime,
    signed_in_after: datetime | None = None,
) -> Row[Any] | GrantRefused:
    """Claim `secret` for `client_id`: its row, or why it grants nothing.

    The claim is one conditional UPDATE. A secret used before revokes its family here, in the caller's
    transaction, which the caller commits before it raises the refusal: hence returned, not raised; so
    does a secret whose principal is revoked now. A secret whose family signed in at or before
    `signed_in_after` is not claimed: it stays unused, and says the same each time it is presented.
    """
    table, hashed = kind.table, kind.hashed
    fresh = (
        [] if signed_in_after is None else [table.c.family_id.in_(_families_signed_in_after(signed_in_after))]
    )
    claimed = conn.execute(
        update(table)
        .where(
            hashed == digest(secret),
            table.c.client_id == client_id,
            table.c.used_at.is_(None),
            table.c.expires_at > now,
            *fresh,
        )
        .values(used_at=now)
        .returning(*table.c)
    ).first()
    if claimed is not None:
        if _family_revoked(conn, claimed.family_id):
            return GrantRefused("revoked", f"the grant this {kind.what} belongs to was revoked")
        if _principal_revoked(conn, claimed.family_id):
            # Revoked after the sign-in began (perhaps while it was at the consent page): end the family
            # now, so restoring the principal does not bring it back.
            _revoke(conn, claimed.family_id, reason="principal_revoked", now=now)
            return GrantRefused("revoked", f"the principal this {kind.what} speaks for is revoked")
        return claimed
    row = conn.execute(select(table).where(hashed == digest(secret))).first()
    refused = _why_not(row, client_id, now, what=kind.what)
    if refused.problem == "reused" and row is not None:
        _revoke(conn, row.family_id, reason=kind.reason, now=now)
    elif refused.problem == "expired" and _signed_in_by(conn, row, signed_in_after):
        # Ended by its sign-in's age (its expiry is capped at it too), not by idling: say which.
        too_old = f"the sign-in this {kind.what} belongs to is too old: sign in again"
        refused = GrantRefused("expired", too_old)
    return refused


def _signed_in_by(conn: Connection, row: Row[Any] | None, when: datetime | None) -> bool:
    """Whether the family of the code or token `row` signed in at or before `when` (False without)."""
    if row is None or when is None:
        return False
    created = conn.execute(
        select(oauth_families.c.created_at).where(oauth_families.c.family_id == row.family_id)
    ).scalar_one_or_none()
    return created is not None and created <= when


def _families_signed_in_after(when: datetime) -> Select[tuple[str]]:
    return select(oauth_families.c.family_id).where(oauth_families.c.created_at > when)


def _principal_revoked(conn: Connection, family_id: str) -> bool:
    """Whether the principal the family speaks for is revoked in its tenant now."""
    family = oauth_families.alias("family")
    found = conn.execute(
        select(revocations.c.subject)
        .select_from(
            family.join(
                revocations,
                (revocations.c.tenant == family.c.tenant) & (revocations.c.subject == family.c.subject),
            )
        )
        .where(family.c.family_id == family_id)
    ).first()
    return found is not None


def _why_not(row: Row[Any] | None, client_id: str, now: datetime, *, what: str) -> GrantRefused:
    if row is None:
        return GrantRefused("unknown", f"no such {what}")
    if row.client_id != client_id:
        return GrantRefused("other_client", f"the {what} was issued to another client")
    if row.used_at is not None:
        return GrantRefused("reused", f"the {what} was used before; its grant is revoked")
    return GrantRefused("expired", f"the {what} expired")


def _client(row: Row[Any]) -> RegisteredClient:
    return RegisteredClient(
        row.client_id,
        json.loads(row.metadata),
        row.issued_at,
        row.secret_hash,
        document_fresh_until=row.document_fresh_until,
    )


def _grantee_json(grantee: Grantee) -> str:
    return canonical_json(
        {
            "subject": grantee.subject,
            "tenant": grantee.tenant,
            "roles": list(grantee.roles),
            "groups": list(grantee.groups),
        }
    )


def _grantee(text: str) -> Grantee:
    data = json.loads(text)
    return Grantee(data["subject"], data["tenant"], tuple(data["roles"]), tuple(data["groups"]))


def _code(row: Row[Any]) -> CodeGrant:
    return CodeGrant(
        family_id=row.family_id,
        client_id=row.client_id,
        redirect_uri=row.redirect_uri,
        scope=row.scope,
        resource=row.resource,
        code_challenge=row.code_challenge,
        code_challenge_method=row.code_challenge_method,
        grantee=_grantee(row.grantee),
        expires_at=row.expires_at,
        used_at=row.used_at,
        nonce=row.nonce,
        auth_time=row.auth_time,
    )


def _refresh(row: Row[Any]) -> RefreshGrant:
    return RefreshGrant(
        family_id=row.family_id,
        client_id=row.client_id,
        scope=row.scope,
        resource=row.resource,
        grantee=_grantee(row.grantee),
        issued_at=row.issued_at,
        expires_at=row.expires_at,
        used_at=row.used_at,
        auth_time=row.auth_time,
    )
