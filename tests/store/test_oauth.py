"""The authorization server's records: codes and refresh tokens used once, reuse revokes the family,
races between replicas (two stores on one database) have one winner, secrets are kept as digests."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TypeVar

import pytest
from sqlalchemy import select

from store import Store
from store.commands import RestorePrincipal, RevokePrincipal
from store.oauth import CodeGrant, Grantee, GrantRefused, RefreshGrant, RegisteredClient
from store.schema import oauth_clients, oauth_codes, oauth_refresh_tokens
from tests.store.builders import NOW

T = TypeVar("T")
ALICE = Grantee("alice", "acme", roles=("agent",), groups=("ops",))
LATER = NOW + timedelta(seconds=30)


def code_grant(family: str = "fam-1", client: str = "client-1", grantee: Grantee = ALICE) -> CodeGrant:
    return CodeGrant(
        family_id=family,
        client_id=client,
        redirect_uri="http://127.0.0.1:5555/callback",
        scope="",
        resource="http://127.0.0.1:8080/mcp",
        code_challenge="c" * 43,
        code_challenge_method="S256",
        grantee=grantee,
        expires_at=NOW + timedelta(minutes=1),
    )


def refresh_grant(family: str = "fam-1", client: str = "client-1") -> RefreshGrant:
    return RefreshGrant(
        family_id=family,
        client_id=client,
        scope="",
        resource="http://127.0.0.1:8080/mcp",
        grantee=ALICE,
        issued_at=NOW,
        expires_at=NOW + timedelta(days=1),
    )


def refused(work: Callable[[], object]) -> str:
    with pytest.raises(GrantRefused) as caught:
        work()
    return caught.value.problem


def race(work: Callable[[], T], other: Callable[[], T]) -> list[T | GrantRefused]:
    """Run both at once, each in its own thread; what each returned or the refusal it raised."""
    barrier = threading.Barrier(2)
    results: list[T | GrantRefused] = []

    def run(task: Callable[[], T]) -> None:
        barrier.wait()
        try:
            results.append(task())
        except GrantRefused as exc:
            results.append(exc)

    threads = [threading.Thread(target=run, args=(task,)) for task in (work, other)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


def test_a_registered_client_is_read_back_with_its_metadata_and_the_digest_it_was_given(
    store: Store,
) -> None:
    metadata = {"redirect_uris": ["http://127.0.0.1:5555/cb"], "client_name": "Claude Code"}
    store.register_client(RegisteredClient("client-1", metadata, NOW, secret_hash="ab" * 32))
    found = store.get_client("client-1")
    assert found == RegisteredClient("client-1", metadata, NOW, secret_hash="ab" * 32)
    assert store.get_client("client-2") is None
    with store.engine.connect() as conn:
        assert conn.execute(select(oauth_clients.c.secret_hash)).scalar_one() == "ab" * 32


def test_a_code_is_kept_as_a_digest_and_redeemed_once_with_what_it_was_bound_to(store: Store) -> None:
    store.issue_code("the-code", code_grant(), now=NOW)
    with store.engine.connect() as conn:
        kept = conn.execute(select(oauth_codes.c.code_hash)).scalar_one()
    assert "the-code" not in kept and len(kept) == 64
    assert store.redeem_code("the-code", client_id="client-1", now=LATER) == code_grant()
    found = store.find_code("the-code")
    assert found is not None and found.used_at == LATER


def test_a_code_for_another_client_an_unknown_or_an_expired_code_is_refused_and_stays_unused(
    store: Store,
) -> None:
    store.issue_code("the-code", code_grant(), now=NOW)
    assert refused(lambda: store.redeem_code("the-code", client_id="client-2", now=LATER)) == "other_client"
    assert refused(lambda: store.redeem_code("no-code", client_id="client-1", now=LATER)) == "unknown"
    expired = NOW + timedelta(minutes=2)
    assert refused(lambda: store.redeem_code("the-code", client_id="client-1", now=expired)) == "expired"
    assert not store.family_revoked("fam-1")
    assert store.redeem_code("the-code", client_id="client-1", now=LATER).family_id == "fam-1"


def test_a_replayed_code_revokes_its_family_and_every_refresh_token_issued_from_it(store: Store) -> None:
    store.issue_code("the-code", code_grant(), now=NOW)
    store.redeem_code("the-code", client_id="client-1", now=LATER)
    store.issue_refresh_token("refresh-1", refresh_grant())
    assert refused(lambda: store.redeem_code("the-code", client_id="client-1", now=LATER)) == "reused"
    assert store.family_revoked("fam-1")
    assert refused(lambda: store.use_refresh_token("refresh-1", client_id="client-1", now=LATER)) == "revoked"


def test_two_replicas_redeeming_one_code_at_once_give_it_to_one_and_revoke_the_family(
    migrated_url: str,
) -> None:
    with Store.open(migrated_url) as one, Store.open(migrated_url) as two:
        one.issue_code("the-code", code_grant(), now=NOW)
        results = race(
            lambda: one.redeem_code("the-code", client_id="client-1", now=LATER),
            lambda: two.redeem_code("the-code", client_id="client-1", now=LATER),
        )
        assert sorted(type(r).__name__ for r in results) == ["CodeGrant", "GrantRefused"]
        assert [r.problem for r in results if isinstance(r, GrantRefused)] == ["reused"]
        assert one.family_revoked("fam-1") and two.family_revoked("fam-1")


def test_a_refresh_token_is_used_once_and_its_successor_works(store: Store) -> None:
    store.issue_code("the-code", code_grant(), now=NOW)
    store.issue_refresh_token("refresh-1", refresh_grant())
    with store.engine.connect() as conn:
        assert "refresh-1" not in conn.execute(select(oauth_refresh_tokens.c.token_hash)).scalar_one()
    used = store.use_refresh_token("refresh-1", client_id="client-1", now=LATER)
    assert used == refresh_grant()
    store.issue_refresh_token("refresh-2", refresh_grant())
    assert store.use_refresh_token("refresh-2", client_id="client-1", now=LATER).family_id == "fam-1"
    assert not store.family_revoked("fam-1")


def test_reusing_a_rotated_refresh_token_revokes_the_family_so_the_newest_one_stops_working(
    store: Store,
) -> None:
    store.issue_code("the-code", code_grant(), now=NOW)
    store.issue_refresh_token("refresh-1", refresh_grant())
    store.use_refresh_token("refresh-1", client_id="client-1", now=LATER)
    store.issue_refresh_token("refresh-2", refresh_grant())
    assert refused(lambda: store.use_refresh_token("refresh-1", client_id="client-1", now=LATER)) == "reused"
    assert store.family_revoked("fam-1")
    assert refused(lambda: store.use_refresh_token("refresh-2", client_id="client-1", now=LATER)) == "revoked"


def test_a_refresh_token_of_another_client_unknown_or_expired_is_refused_without_revoking(
    store: Store,
) -> None:
    store.issue_code("the-code", code_grant(), now=NOW)
    store.issue_refresh_token("refresh-1", refresh_grant())
    late = NOW + timedelta(days=2)
    other = refused(lambda: store.use_refresh_token("refresh-1", client_id="other", now=LATER))
    assert other == "other_client"
    assert refused(lambda: store.use_refresh_token("nope", client_id="client-1", now=LATER)) == "unknown"
    assert refused(lambda: store.use_refresh_token("refresh-1", client_id="client-1", now=late)) == "expired"
    assert not store.family_revoked("fam-1")


def test_two_replicas_using_one_refresh_token_at_once_give_it_to_one_and_revoke_the_family(
    migrated_url: str,
) -> None:
    with Store.open(migrated_url) as one, Store.open(migrated_url) as two:
        one.issue_code("the-code", code_grant(), now=NOW)
        one.issue_refresh_token("refresh-1", refresh_grant())
        results = race(
            lambda: one.use_refresh_token("refresh-1", client_id="client-1", now=LATER),
            lambda: two.use_refresh_token("refresh-1", client_id="client-1", now=LATER),
        )
        assert sorted(type(r).__name__ for r in results) == ["GrantRefused", "RefreshGrant"]
        assert [r.problem for r in results if isinstance(r, GrantRefused)] == ["reused"]
        assert two.family_revoked("fam-1")


def test_an_unknown_family_counts_as_revoked_and_a_revocation_is_reported_once(store: Store) -> None:
    assert store.family_revoked("never-issued")
    store.issue_code("the-code", code_grant(), now=NOW)
    assert store.revoke_family("fam-1", reason="client_revoked", now=LATER)
    assert not store.revoke_family("fam-1", reason="client_revoked", now=LATER)
    assert refused(lambda: store.redeem_code("the-code", client_id="client-1", now=LATER)) == "revoked"


def test_revoking_a_principal_revokes_its_sign_ins_in_that_tenant_only_and_records_how_many(
    store: Store,
) -> None:
    store.issue_code("code-a", code_grant("fam-a"), now=NOW)
    store.issue_code("code-b", code_grant("fam-b"), now=NOW)
    store.issue_code("code-c", code_grant("fam-c", grantee=Grantee("alice", "globex")), now=NOW)
    store.issue_code("code-d", code_grant("fam-d", grantee=Grantee("bob", "acme")), now=NOW)
    store.issue_refresh_token("refresh-a", refresh_grant("fam-a"))
    store.revoke_principal(RevokePrincipal("acme", "alice", revoked_by="root", reason="left", now=LATER))
    assert store.family_revoked("fam-a") and store.family_revoked("fam-b")
    assert not store.family_revoked("fam-c") and not store.family_revoked("fam-d")
    assert refused(lambda: store.use_refresh_token("refresh-a", client_id="client-1", now=LATER)) == "revoked"
    revoked = [e for e in store.events(tenant="acme") if e.type == "principal.revoked"]
    assert revoked[-1].payload["grants_revoked"] == 2
    assert store.verify().ok


def test_a_codes_nonce_and_sign_in_time_come_back_and_the_nonce_counts_as_used_for_its_client_only(
    store: Store,
) -> None:
    signed_in = NOW - timedelta(seconds=5)
    grant = replace(code_grant(), scope="openid", nonce="n-0S6_WzA2Mj ~+/=", auth_time=signed_in)
    assert not store.nonce_used("client-1", "n-0S6_WzA2Mj ~+/=")
    store.issue_code("the-code", grant, now=NOW)
    redeemed = store.redeem_code("the-code", client_id="client-1", now=LATER)
    assert (redeemed.nonce, redeemed.auth_time) == ("n-0S6_WzA2Mj ~+/=", signed_in)
    assert store.nonce_used("client-1", "n-0S6_WzA2Mj ~+/=")
    assert not store.nonce_used("client-2", "n-0S6_WzA2Mj ~+/=")
    assert not store.nonce_used("client-1", "n-0S6_WzA2Mj")
    store.issue_code("no-nonce", code_grant(family="fam-2"), now=NOW)
    found = store.find_code("no-nonce")
    assert found is not None and (found.nonce, found.auth_time) == (None, None)


def test_a_refresh_token_carries_its_familys_sign_in_time(store: Store) -> None:
    signed_in = NOW - timedelta(hours=2)
    store.issue_code("the-code", code_grant(), now=NOW)
    store.issue_refresh_token("refresh-1", replace(refresh_grant(), auth_time=signed_in))
    used = store.use_refresh_token("refresh-1", client_id="client-1", now=LATER)
    assert used.auth_time == signed_in


def test_a_code_issued_while_its_principal_is_revoked_is_refused_and_stays_so_after_restore(
    store: Store,
) -> None:
    # A consent that checked the principal's standing just before the revocation committed: the
    # code's sign-in reaches the store after the revocation ended the ones it saw.
    store.revoke_principal(RevokePrincipal("acme", "alice", revoked_by="root", now=NOW))
    store.issue_code("the-code", code_grant(), now=NOW)
    assert refused(lambda: store.redeem_code("the-code", client_id="client-1", now=LATER)) == "revoked"
    assert store.family_revoked("fam-1")
    store.restore_principal(RestorePrincipal("acme", "alice", restored_by="root", now=LATER))
    assert store.family_revoked("fam-1")


def test_a_refresh_token_of_a_revoked_principal_is_refused_and_ends_its_sign_in(store: Store) -> None:
    store.revoke_principal(RevokePrincipal("acme", "alice", revoked_by="root", now=NOW))
    store.issue_code("the-code", code_grant(), now=NOW)  # after the revocation, as above
    store.issue_refresh_token("refresh-1", refresh_grant())
    assert refused(lambda: store.use_refresh_token("refresh-1", client_id="client-1", now=LATER)) == "revoked"
    assert store.family_revoked("fam-1")
    # Another principal's sign-in in the same tenant is not touched.
    store.issue_code("bobs-code", code_grant("fam-bob", grantee=Grantee("bob", "acme")), now=NOW)
    assert store.redeem_code("bobs-code", client_id="client-1", now=LATER).family_id == "fam-bob"


def test_restoring_a_principal_ends_the_sign_ins_made_while_it_was_revoked(store: Store) -> None:
    store.issue_code("before", code_grant("fam-before"), now=NOW)
    store.revoke_principal(RevokePrincipal("acme", "alice", revoked_by="root", now=NOW))
    store.issue_code("during", code_grant("fam-during"), now=NOW)  # never presented while revoked
    store.issue_refresh_token("refresh-during", refresh_grant("fam-during"))
    store.issue_code("bobs", code_grant("fam-bob", grantee=Grantee("bob", "acme")), now=NOW)
    store.restore_principal(RestorePrincipal("acme", "alice", restored_by="root", now=LATER))
    assert store.family_revoked("fam-before") and store.family_revoked("fam-during")
    assert not store.family_revoked("fam-bob")
    assert refused(lambda: store.redeem_code("during", client_id="client-1", now=LATER)) == "revoked"
    during = refused(lambda: store.use_refresh_token("refresh-during", client_id="client-1", now=LATER))
    assert during == "revoked"
    # Signing in again after the restore works.
    store.issue_code("after", code_grant("fam-after"), now=LATER)
    assert store.redeem_code("after", client_id="client-1", now=LATER).family_id == "fam-after"
    assert store.verify().ok


def test_a_refresh_token_of_a_sign_in_older_than_allowed_is_refused_and_left_unused(store: Store) -> None:
    store.issue_code("the-code", code_grant(), now=NOW)
    store.issue_refresh_token("refresh-1", refresh_grant())

    def use(signed_in_after: datetime | None) -> RefreshGrant:
        return store.use_refresh_token(
            "refresh-1", client_id="client-1", now=LATER, signed_in_after=signed_in_after
        )

    with pytest.raises(GrantRefused, match="too old: sign in again") as caught:
        use(NOW)  # the family signed in at NOW: not after it
    assert caught.value.problem == "expired"
    assert refused(lambda: use(NOW)) == "expired"  # the same answer again, not a reuse
    assert not store.family_revoked("fam-1")
    assert use(NOW - timedelta(seconds=1)).family_id == "fam-1"
