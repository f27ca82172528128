"""The console's sign-in sessions: kept by a digest of their id, found until they expire, ended by
logging out or revoking the principal, refused once their grant family is revoked; shared by every
replica (two stores on one database)."""

from __future__ import annotations

import hashlib
from datetime import timedelta

import pytest
from sqlalchemy import func, select

from store import PrincipalRecord, Store, StoreError
from store.commands import RestorePrincipal, RevokePrincipal
from store.console_sessions import ConsoleSession
from store.oauth import CodeGrant, Grantee
from store.schema import console_sessions
from tests.store.builders import NOW

BOB = PrincipalRecord(
    "bob", "acme", roles=("approver", "auditor"), scopes=("writ",), client_id="cli", groups=("ops",)
)
HOUR = timedelta(hours=1)


def session(
    who: PrincipalRecord = BOB, *, family: str | None = None, lasts: timedelta = HOUR
) -> ConsoleSession:
    return ConsoleSession(principal=who, created_at=NOW, expires_at=NOW + lasts, grant_family=family)


def kept(store: Store) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(console_sessions)).scalar_one())


def test_a_session_is_found_by_its_id_with_the_whole_principal_until_it_expires(store: Store) -> None:
    opened = session()
    store.open_console_session("sid-1", opened)

    assert store.console_session("sid-1", now=NOW) == opened
    assert store.console_session("sid-1", now=NOW + HOUR - timedelta(microseconds=1)) == opened
    assert store.console_session("sid-1", now=NOW + HOUR) is None  # expired: as good as unknown
    assert store.console_session("sid-2", now=NOW) is None  # never opened
    assert store.console_session("", now=NOW) is None


def test_only_the_ids_digest_is_kept_never_the_id(store: Store) -> None:
    store.open_console_session("the-secret-session-id", session())

    with store.engine.connect() as conn:
        row = conn.execute(select(console_sessions)).one()

    assert row.session_hash == hashlib.sha256(b"the-secret-session-id").hexdigest()
    assert "the-secret-session-id" not in str(tuple(row))


def test_ending_a_session_deletes_it_and_a_second_end_finds_nothing(store: Store) -> None:
    store.open_console_session("sid-1", session())
    store.open_console_session("sid-2", session())

    assert store.end_console_session("sid-1", now=NOW)
    assert not store.end_console_session("sid-1", now=NOW)
    assert not store.end_console_session("never-opened", now=NOW)

    assert store.console_session("sid-1", now=NOW) is None
    assert store.console_session("sid-2", now=NOW) == session()  # the principal's other session stays


def test_opening_a_session_deletes_the_expired_ones(store: Store) -> None:
    store.open_console_session("short", session(lasts=timedelta(minutes=1)))
    store.open_console_session("long", session(lasts=HOUR))
    later = ConsoleSession(BOB, NOW + timedelta(minutes=5), NOW + HOUR)

    store.open_console_session("new", later)

    assert kept(store) == 2
    assert store.console_session("long", now=later.created_at) is not None


def test_a_session_that_ends_before_it_begins_is_refused(store: Store) -> None:
    with pytest.raises(ValueError, match="must end after it begins"):
        store.open_console_session("sid-1", session(lasts=timedelta(0)))
    assert kept(store) == 0


def test_the_same_id_twice_is_a_store_error_and_keeps_the_first(store: Store) -> None:
    store.open_console_session("sid-1", session())
    other = session(PrincipalRecord("mallory", "acme", roles=("admin",)))

    with pytest.raises(StoreError):
        store.open_console_session("sid-1", other)

    assert store.console_session("sid-1", now=NOW) == session()


def test_revoking_a_principal_ends_their_sessions_in_that_tenant_only(store: Store) -> None:
    store.open_console_session("bob-1", session())
    store.open_console_session("bob-2", session())
    store.open_console_session("bob-elsewhere", session(PrincipalRecord("bob", "globex")))
    store.open_console_session("carol", session(PrincipalRecord("carol", "acme")))

    store.revoke_principal(RevokePrincipal("acme", "bob", revoked_by="root", reason="left", now=NOW))

    assert store.console_session("bob-1", now=NOW) is None
    assert store.console_session("bob-2", now=NOW) is None
    assert store.console_session("bob-elsewhere", now=NOW) is not None
    assert store.console_session("carol", now=NOW) is not None
    # Restoring gives back the standing, not the sessions: bob logs in again.
    store.restore_principal(RestorePrincipal("acme", "bob", restored_by="root", now=NOW))
    assert store.console_session("bob-1", now=NOW) is None


def test_a_session_whose_grant_family_is_revoked_or_unknown_is_refused(store: Store) -> None:
    store.issue_code(
        "code-1",
        CodeGrant(
            family_id="fam-1",
            client_id="client-1",
            redirect_uri="http://127.0.0.1:5555/callback",
            scope="",
            resource="http://127.0.0.1:8080/mcp",
            code_challenge="c" * 43,
            code_challenge_method="S256",
            grantee=Grantee("bob", "acme"),
            expires_at=NOW + timedelta(minutes=1),
        ),
        now=NOW,
    )
    store.open_console_session("signed-in", session(family="fam-1"))
    store.open_console_session("no-such-family", session(family="fam-unknown"))

    assert store.console_session("signed-in", now=NOW) is not None
    assert store.console_session("no-such-family", now=NOW) is None  # nothing vouches for it

    store.revoke_family("fam-1", reason="revoked", now=NOW)

    assert store.console_session("signed-in", now=NOW) is None


def test_a_session_opened_by_one_replica_is_found_and_ended_by_another(migrated_url: str) -> None:
    with Store.open(migrated_url) as one, Store.open(migrated_url) as other:
        one.open_console_session("sid-1", session())
        assert other.console_session("sid-1", now=NOW) == session()

        assert other.end_console_session("sid-1", now=NOW)

        assert one.console_session("sid-1", now=NOW) is None


def test_sessions_are_not_projections_and_a_rebuild_leaves_them(store: Store) -> None:
    store.open_console_session("sid-1", session())

    store.rebuild()

    assert store.console_session("sid-1", now=NOW) == session()
    assert not [e for e in store.events() if "session" in e.type]
