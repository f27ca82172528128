"""An admin's view of the clients signed in at the authorization server, on both stores: each client
with its live sign-ins (who, since when, until when), a client's metadata document kept and replaced,
and `oauth.client_revoked`, which ends every sign-in of a client in one tenant and is in the log."""

from __future__ import annotations

from datetime import timedelta

import pytest

from store import Store
from store.model import NotFound
from store.oauth import Grantee, RegisteredClient
from store.oauth_clients import RevokeClient
from tests.store.builders import NOW
from tests.store.test_oauth import code_grant, refresh_grant

ALICE = Grantee("alice", "acme", roles=("agent",))
BOB = Grantee("bob", "acme", roles=("agent",))
CAROL = Grantee("carol", "other", roles=("agent",))
LIVE_AFTER = NOW - timedelta(minutes=20)
DOC = "https://app.example.com/oauth/client.json"


def signed_in(store: Store, family: str, client: str, who: Grantee, *, refresh: bool = True) -> None:
    store.issue_code(f"code-{family}", code_grant(family, client, who), now=NOW - timedelta(minutes=1))
    if refresh:
        store.issue_refresh_token(f"rt-{family}", refresh_grant(family, client))


def register(store: Store, client_id: str, name: str) -> None:
    metadata = {"client_name": name, "redirect_uris": ["http://127.0.0.1:5555/callback"]}
    store.register_client(RegisteredClient(client_id, metadata, NOW - timedelta(days=1)))


def test_clients_are_listed_with_their_live_sign_ins_in_the_tenant(store: Store) -> None:
    register(store, "client-1", "Claude Code")
    register(store, "client-2", "Inspector")
    signed_in(store, "f1", "client-1", ALICE)
    signed_in(store, "f2", "client-1", BOB)
    signed_in(store, "f3", "client-2", ALICE)
    signed_in(store, "f4", "client-2", CAROL)
    store.revoke_family("f3", reason="token_revoked", now=NOW)

    listed = store.oauth_clients(tenant="acme", now=NOW, live_after=LIVE_AFTER)

    assert [(c.client_id, c.name, c.kind, c.live_sign_ins) for c in listed] == [
        ("client-1", "Claude Code", "registered", 2),
        ("client-2", "Inspector", "registered", 0),
    ]
    everywhere = store.oauth_clients(tenant=None, now=NOW, live_after=LIVE_AFTER)
    assert {c.client_id: c.live_sign_ins for c in everywhere} == {"client-1": 2, "client-2": 1}
    # The console's page reads every client's detail at once: the same as one client at a time.
    details = store.oauth_client_details(tenant="acme", now=NOW, live_after=LIVE_AFTER)
    assert details == [
        store.oauth_client(c.client_id, tenant="acme", now=NOW, live_after=LIVE_AFTER) for c in listed
    ]
    assert {s.subject for s in details[0].sign_ins} == {"alice", "bob"} and details[1].sign_ins == ()


def test_a_client_is_shown_with_each_live_sign_in_its_subject_and_times(store: Store) -> None:
    register(store, "client-1", "Claude Code")
    signed_in(store, "f1", "client-1", ALICE)
    store.use_refresh_token("rt-f1", client_id="client-1", now=NOW)
    store.issue_refresh_token("rt-f1b", refresh_grant("f1", "client-1"))
    # A code long redeemed and no refresh token: its access token ran out long ago.
    store.issue_code("code-old", code_grant("f-old", "client-1", BOB), now=NOW - timedelta(hours=2))

    shown = store.oauth_client("client-1", tenant="acme", now=NOW, live_after=LIVE_AFTER)

    assert shown.redirect_uris == ("http://127.0.0.1:5555/callback",)
    assert [(s.family_id, s.subject, s.tenant) for s in shown.sign_ins] == [("f1", "alice", "acme")]
    only = shown.sign_ins[0]
    assert only.signed_in_at == NOW - timedelta(minutes=1)
    assert only.last_refreshed_at == NOW and only.refresh_expires_at == NOW + timedelta(days=1)
    assert shown.client.live_sign_ins == 1


def test_a_client_that_signed_no_one_in_in_the_tenant_is_not_found(store: Store) -> None:
    signed_in(store, "f4", "client-2", CAROL)

    with pytest.raises(NotFound):
        store.oauth_client("client-2", tenant="acme", now=NOW, live_after=LIVE_AFTER)
    with pytest.raises(NotFound):
        store.revoke_oauth_client(RevokeClient("client-2", "acme", revoked_by="root", now=NOW))
    assert [e for e in store.events(tenant="acme") if e.type == "oauth.client_revoked"] == []


def test_revoking_a_client_ends_its_sign_ins_in_the_tenant_only_and_is_recorded(store: Store) -> None:
    register(store, "client-1", "Claude Code")
    signed_in(store, "f1", "client-1", ALICE)
    signed_in(store, "f2", "client-1", BOB)
    signed_in(store, "f4", "client-1", CAROL)

    revoked = store.revoke_oauth_client(
        RevokeClient("client-1", "acme", revoked_by="root", now=NOW, reason="lost laptop")
    )

    assert revoked.sign_ins_ended == 2
    assert store.family_revoked("f1") and store.family_revoked("f2")
    assert not store.family_revoked("f4"), "another tenant's sign-in stays"
    events = [e for e in store.events(tenant="acme") if e.type == "oauth.client_revoked"]
    assert [e.payload for e in events] == [
        {
            "client_id": "client-1",
            "client_name": "Claude Code",
            "revoked_by": "root",
            "sign_ins_ended": 2,
            "reason": "lost laptop",
            "break_glass": False,
        }
    ]
    assert store.oauth_client("client-1", tenant="acme", now=NOW, live_after=LIVE_AFTER).sign_ins == ()
    # Again: nothing left to end, and the admin's act is recorded all the same.
    assert (
        store.revoke_oauth_client(RevokeClient("client-1", "acme", revoked_by="root", now=NOW)).sign_ins_ended
        == 0
    )
    assert store.verify().ok


def test_a_metadata_document_is_kept_and_replaced_by_a_later_fetch(store: Store) -> None:
    first = RegisteredClient(DOC, {"client_id": DOC, "client_name": "One"}, NOW, document_fresh_until=NOW)
    later = NOW + timedelta(minutes=5)
    second = RegisteredClient(
        DOC,
        {"client_id": DOC, "client_name": "Two"},
        later,
        document_fresh_until=later + timedelta(minutes=5),
    )

    store.keep_client_document(first)
    store.keep_client_document(second)

    kept = store.get_client(DOC)
    assert kept is not None and kept.metadata["client_name"] == "Two"
    assert (kept.issued_at, kept.document_fresh_until, kept.secret_hash) == (
        later,
        later + timedelta(minutes=5),
        None,
    )
    signed_in(store, "f9", DOC, ALICE)
    listed = store.oauth_clients(tenant="acme", now=NOW, live_after=LIVE_AFTER)
    assert [(c.client_id, c.kind, c.name) for c in listed] == [(DOC, "metadata_document", "Two")]
