"""The console's sign-in sessions: what the `writ_session` cookie names, kept in the store.

The cookie holds a random session id, never the bearer token pasted at login: cookies ignore ports,
so a server on another port of the console's host receives every cookie sent under /console, and a
bearer token there would work on /mcp and /api too. A session id opens only the console, only until
it ends: at logout (its row is deleted, so a copied cookie is worth nothing afterwards), at the
token's own expiry or `MAX_SESSION` after login, whichever comes first, when the principal is revoked,
or when the sign-in at Writ's authorization server the token came from is revoked. The store keeps
only the id's sha256, with the principal the console acts as; every replica finds the same sessions.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

import anyio.to_thread

from gateway.calls.authorize import principal_of_record, record_of
from policy.model import Principal
from store.console_sessions import ConsoleSession
from store.ports import ConsoleSessions

MAX_SESSION = timedelta(hours=12)
"""The longest a console session lasts, however long the pasted token is valid."""
SESSION_ID_BYTES = 32


@dataclass(frozen=True, slots=True)
class SignIn:
    """What a token pasted at the login verified as: whom it speaks for, until when."""

    principal: Principal
    expires_at: datetime
    """The token's own expiry (`exp`): no session outlives it."""
    grant_family: str | None = None
    """The sign-in at Writ's authorization server the token belongs to, if it does."""


class Sessions:
    """Opens, finds and ends console sessions in the store."""

    def __init__(self, store: ConsoleSessions, *, max_age: timedelta = MAX_SESSION) -> None:
        self.store = store
        self.max_age = max_age

    def expiry(self, sign_in: SignIn, now: datetime) -> datetime:
        """When a session opened now for `sign_in` ends: at the token's expiry, at most `max_age` on."""
        return min(sign_in.expires_at, now + self.max_age)

    async def open(self, sign_in: SignIn, now: datetime) -> str:
        """A new session for `sign_in`; returns its id, for the cookie (the store keeps its digest).

        Raises:
            ValueError: the token expires by `now` (it verified within the verifier's leeway).
        """
        session_id = secrets.token_urlsafe(SESSION_ID_BYTES)
        session = ConsoleSession(
            principal=record_of(sign_in.principal),
            created_at=now,
            expires_at=self.expiry(sign_in, now),
            grant_family=sign_in.grant_family,
        )
        await anyio.to_thread.run_sync(self.store.open_console_session, session_id, session)
        return session_id

    async def principal(self, session_id: str, now: datetime) -> Principal | None:
        """The principal of the session `session_id`; None if it is unknown, ended or expired."""
        found = await anyio.to_thread.run_sync(lambda: self.store.console_session(session_id, now=now))
        return None if found is None else principal_of_record(found.principal)

    async def end(self, session_id: str, now: datetime) -> bool:
        """End the session `session_id` (logging out); False if it had ended already."""
        return await anyio.to_thread.run_sync(lambda: self.store.end_console_session(session_id, now=now))
