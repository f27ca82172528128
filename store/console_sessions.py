"""The web console's sign-in sessions, kept in the store so every replica knows them.

A session is opened when a token pasted at the console's login verifies: the browser's cookie holds a
random session id, and the store keeps only that id's sha256 (a copy of the database opens no
session), with the principal the console acts as and when the session ends. Logging out deletes the
row, so a copied cookie is worth nothing afterwards; revoking the principal (`store.revoking`) deletes
all of theirs; a session whose sign-in at Writ's authorization server (its grant family) was revoked
is refused. Every session opened deletes those that expired. Not a projection: nothing of it is in the
log, and a rebuild leaves it alone.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import Connection, delete, exists, insert, or_, select

from store.canonical import canonical_json
from store.model import PrincipalRecord
from store.schema import console_sessions, oauth_families

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ConsoleSession:
    """One sign-in at the console: whom it acts as, from when until when."""

    principal: PrincipalRecord
    created_at: datetime
    expires_at: datetime
    grant_family: str | None = None
    """The sign-in at Writ's authorization server the pasted token belongs to, if it does: revoking
    that family ends the session too."""


def session_digest(session_id: str) -> str:
    """How a session id is kept: its sha256, in hex."""
    return hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()


class ConsoleSessionRecords:
    """Mixed into `Store`, which provides `_write` (one write transaction) and `_look` (one read)."""

    def _write(self, now: datetime, work: Callable[[Connection], T]) -> T:
        raise NotImplementedError

    def _look(self) -> AbstractContextManager[Connection]:
        raise NotImplementedError

    def open_console_session(self, session_id: str, session: ConsoleSession) -> None:
        """Keep a new session under `session_id`'s digest, and delete the sessions that expired by its
        `created_at`.

        Raises:
            ValueError: the session would end before it begins.
            StoreError: the id is one already kept (never, for a random id of 32 bytes).
        """
        if session.expires_at <= session.created_at:
            raise ValueError("a console session must end after it begins")

        def work(conn: Connection) -> None:
            now = session.created_at
            conn.execute(delete(console_sessions).where(console_sessions.c.expires_at <= now))
            conn.execute(
                insert(console_sessions).values(
                    session_hash=session_digest(session_id),
                    tenant=session.principal.tenant,
                    subject=session.principal.subject,
                    principal=canonical_json(session.principal.to_json()),
                    grant_family=session.grant_family,
                    created_at=session.created_at,
                    expires_at=session.expires_at,
                )
            )

        self._write(session.created_at, work)

    def console_session(self, session_id: str, *, now: datetime) -> ConsoleSession | None:
        """The session kept under `session_id`; None if it is unknown, ended, expired by `now`, or its
        sign-in at the authorization server was revoked."""
        family = oauth_families.c
        live_family = or_(
            console_sessions.c.grant_family.is_(None),
            exists().where(family.family_id == console_sessions.c.grant_family, family.revoked_at.is_(None)),
        )
        with self._look() as conn:
            row = conn.execute(
                select(console_sessions).where(
                    console_sessions.c.session_hash == session_digest(session_id),
                    console_sessions.c.expires_at > now,
                    live_family,
                )
            ).first()
        if row is None:
            return None
        return ConsoleSession(
            principal=_principal(row.principal),
            created_at=row.created_at,
            expires_at=row.expires_at,
            grant_family=row.grant_family,
        )

    def end_console_session(self, session_id: str, *, now: datetime) -> bool:
        """Delete the session kept under `session_id` (logging out); False if there was none."""

        def work(conn: Connection) -> bool:
            deleted = conn.execute(
                delete(console_sessions).where(console_sessions.c.session_hash == session_digest(session_id))
            )
            return bool(deleted.rowcount)

        return self._write(now, work)


def end_principal_sessions(conn: Connection, tenant: str, subject: str) -> int:
    """Delete every console session of a principal; returns how many (used by `revoking.revoke`)."""
    deleted = conn.execute(
        delete(console_sessions).where(
            console_sessions.c.tenant == tenant, console_sessions.c.subject == subject
        )
    )
    return int(deleted.rowcount or 0)


def _principal(text: str) -> PrincipalRecord:
    data: dict[str, Any] = json.loads(text)
    return PrincipalRecord.from_json(data)
