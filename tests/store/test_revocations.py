"""Revocation is an event; its projection answers `is_revoked` per tenant and survives a rebuild."""

from __future__ import annotations

from datetime import timedelta

import pytest

from store import Store
from store.commands import RestorePrincipal, RevokePrincipal
from store.model import NotFound
from tests.store.builders import NOW, call_request


def test_a_revoked_subject_is_revoked_in_its_tenant_only(store: Store) -> None:
    assert not store.is_revoked("acme", "alice")
    revocation = store.revoke_principal(
        RevokePrincipal("acme", "alice", revoked_by="root", reason="left", now=NOW)
    )
    assert (revocation.subject, revocation.revoked_by, revocation.reason) == ("alice", "root", "left")
    assert store.is_revoked("acme", "alice")
    assert not store.is_revoked("globex", "alice") and not store.is_revoked("acme", "bob")


def test_revocation_is_a_logged_event_and_a_repeat_keeps_the_first_standing(store: Store) -> None:
    store.revoke_principal(RevokePrincipal("acme", "alice", revoked_by="root", reason="first", now=NOW))
    again = store.revoke_principal(
        RevokePrincipal("acme", "alice", revoked_by="ops", reason="again", now=NOW + timedelta(1))
    )
    assert again.reason == "first"
    revoked = [e for e in store.events(tenant="acme") if e.type == "principal.revoked"]
    assert [e.payload["reason"] for e in revoked] == ["first", "again"]
    assert store.verify().ok


def test_revocations_are_rebuilt_from_the_log(store: Store) -> None:
    store.revoke_principal(RevokePrincipal("acme", "alice", revoked_by="root", now=NOW))
    store.rebuild()
    assert store.is_revoked("acme", "alice")


def test_admitting_a_call_of_a_revoked_subject_records_a_refusal_and_claims_no_key(store: Store) -> None:
    store.revoke_principal(RevokePrincipal("acme", "alice", revoked_by="root", now=NOW))
    admission = store.admit(call_request(tenant="acme", subject="alice", idempotency_key="k-revoked"))
    assert admission.kind == "new" and not admission.owns_dispatch
    assert (admission.call.status, admission.call.reason) == ("denied", "principal_revoked")
    types = [e.type for e in store.events(tool_call_id=admission.call.tool_call_id)]
    assert types == ["tool_call.requested", "tool_call.denied"]
    assert store.find_call_by_key("acme", "alice", "k-revoked") is None
    other = store.admit(call_request(tenant="acme", subject="bob", idempotency_key="k-bob"))
    assert other.owns_dispatch


def test_a_restore_lifts_the_revocation_in_its_tenant_and_is_a_logged_event(store: Store) -> None:
    store.revoke_principal(RevokePrincipal("acme", "alice", revoked_by="root", reason="left", now=NOW))
    store.revoke_principal(RevokePrincipal("globex", "alice", revoked_by="root", now=NOW))
    later = NOW + timedelta(1)
    lifted = store.restore_principal(
        RestorePrincipal("acme", "alice", restored_by="ops", reason="back", now=later)
    )
    assert (lifted.revoked_by, lifted.reason) == ("root", "left")
    assert not store.is_revoked("acme", "alice") and store.is_revoked("globex", "alice")
    restored = [e for e in store.events(tenant="acme") if e.type == "principal.restored"]
    assert [(e.payload["subject"], e.payload["restored_by"], e.payload["reason"]) for e in restored] == [
        ("alice", "ops", "back")
    ]
    assert store.verify().ok


def test_restoring_a_subject_that_is_not_revoked_is_refused_and_records_nothing(store: Store) -> None:
    with pytest.raises(NotFound, match="not revoked in tenant acme"):
        store.restore_principal(RestorePrincipal("acme", "alice", restored_by="ops", now=NOW))
    assert [e for e in store.events(tenant="acme") if e.type.startswith("principal.")] == []


def test_revoke_restore_revoke_is_rebuilt_from_the_log_as_it_stood(store: Store) -> None:
    store.revoke_principal(RevokePrincipal("acme", "alice", revoked_by="root", reason="one", now=NOW))
    store.restore_principal(RestorePrincipal("acme", "alice", restored_by="ops", now=NOW + timedelta(1)))
    store.revoke_principal(RevokePrincipal("acme", "bob", revoked_by="root", now=NOW))
    store.restore_principal(RestorePrincipal("acme", "bob", restored_by="ops", now=NOW + timedelta(1)))
    store.revoke_principal(
        RevokePrincipal("acme", "alice", revoked_by="sec", reason="two", now=NOW + timedelta(2))
    )
    store.rebuild()
    standing = store.restore_principal(
        RestorePrincipal("acme", "alice", restored_by="ops", now=NOW + timedelta(3))
    )
    assert (standing.revoked_by, standing.reason) == ("sec", "two")
    store.rebuild()
    assert not store.is_revoked("acme", "alice") and not store.is_revoked("acme", "bob")


def test_a_break_glass_revocation_is_marked_in_its_event(store: Store) -> None:
    store.revoke_principal(
        RevokePrincipal("acme", "alice", revoked_by="operator:root@pod", now=NOW, break_glass=True)
    )
    store.restore_principal(RestorePrincipal("acme", "alice", restored_by="ops", now=NOW))
    marks = [(e.type, e.payload["break_glass"]) for e in store.events(tenant="acme")]
    assert marks == [("principal.revoked", True), ("principal.restored", False)]


def test_the_tenants_a_subject_was_seen_in_are_listed(store: Store) -> None:
    store.admit(call_request(tenant="globex", subject="alice", idempotency_key="k-a"))
    store.revoke_principal(RevokePrincipal("initech", "alice", revoked_by="root", now=NOW))
    store.admit(call_request(tenant="acme", subject="bob", idempotency_key="k-b", run_id="run-b"))
    assert store.tenants_of("alice") == ["globex", "initech"]
    assert store.tenants_of("carol") == []
