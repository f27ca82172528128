"""Revocation is an event; its projection answers `is_revoked` per tenant and survives a rebuild."""

from __future__ import annotations

from datetime import timedelta

from store import Store
from tests.store.builders import NOW, call_request


def test_a_revoked_subject_is_revoked_in_its_tenant_only(store: Store) -> None:
    assert not store.is_revoked("acme", "alice")
    revocation = store.revoke_principal("acme", "alice", revoked_by="root", reason="left", now=NOW)
    assert (revocation.subject, revocation.revoked_by, revocation.reason) == ("alice", "root", "left")
    assert store.is_revoked("acme", "alice")
    assert not store.is_revoked("globex", "alice") and not store.is_revoked("acme", "bob")


def test_revocation_is_a_logged_event_and_a_repeat_keeps_the_first_standing(store: Store) -> None:
    store.revoke_principal("acme", "alice", revoked_by="root", reason="first", now=NOW)
    again = store.revoke_principal("acme", "alice", revoked_by="ops", reason="again", now=NOW + timedelta(1))
    assert again.reason == "first"
    revoked = [e for e in store.events(tenant="acme") if e.type == "principal.revoked"]
    assert [e.payload["reason"] for e in revoked] == ["first", "again"]
    assert store.verify().ok


def test_revocations_are_rebuilt_from_the_log(store: Store) -> None:
    store.revoke_principal("acme", "alice", revoked_by="root", now=NOW)
    store.rebuild()
    assert store.is_revoked("acme", "alice")


def test_admitting_a_call_of_a_revoked_subject_records_a_refusal_and_claims_no_key(store: Store) -> None:
    store.revoke_principal("acme", "alice", revoked_by="root", now=NOW)
    admission = store.admit(call_request(tenant="acme", subject="alice", idempotency_key="k-revoked"))
    assert admission.kind == "new" and not admission.owns_dispatch
    assert (admission.call.status, admission.call.reason) == ("denied", "principal_revoked")
    types = [e.type for e in store.events(tool_call_id=admission.call.tool_call_id)]
    assert types == ["tool_call.requested", "tool_call.denied"]
    assert store.find_call_by_key("acme", "alice", "k-revoked") is None
    other = store.admit(call_request(tenant="acme", subject="bob", idempotency_key="k-bob"))
    assert other.owns_dispatch
