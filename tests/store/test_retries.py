"""Retries a person asks for (`writ calls retry`), in the store, on both stores: the retry is a new
call linked to its failed original by `tool_call.retry_requested`, checked under the head lock."""

from __future__ import annotations

from datetime import timedelta

import pytest

from store import Store
from store.commands import ResolveManually, RevokePrincipal, StopRun
from store.model import CallView, RetryLink, RetryRefused, StoreError
from tests.store.builders import NOW, call_request, outcome
from tests.store.racing import at_once

LATER = NOW + timedelta(minutes=5)


def failed(store: Store, tool_call_id: str = "orig", key: str = "key-1") -> CallView:
    store.admit(call_request(tool_call_id=tool_call_id, idempotency_key=key))
    return store.record_outcome(outcome(tool_call_id, "failed", now=NOW, error="backend said no"))


def link(of: str = "orig", *, by: str = "carol", same_key: bool = False, number: int = 1) -> RetryLink:
    return RetryLink(of, number, by, "card fixed", break_glass=False, same_key=same_key)


def test_a_retry_of_a_failed_call_is_a_new_call_under_a_new_key_linked_both_ways(store: Store) -> None:
    failed(store)

    retry = store.admit(
        call_request(tool_call_id="re", idempotency_key="key-1:retry-1", retry=link(), now=LATER)
    )

    assert retry.owns_dispatch and retry.call.status == "dispatching"
    original = store.events(tool_call_id="orig")
    asked = [e for e in original if e.type == "tool_call.retry_requested"]
    assert [e.payload for e in asked] == [
        {
            "requested_by": "carol",
            "reason": "card fixed",
            "break_glass": False,
            "retry_tool_call_id": "re",
            "retry_number": 1,
            "idempotency_key": "key-1:retry-1",
            "same_key": False,
        }
    ]
    requested = store.events(tool_call_id="re")[0]
    assert (requested.payload["retry_of"], requested.payload["retry_number"]) == ("orig", 1)
    kept = store.get_call("orig")
    assert kept is not None and kept.status == "failed"
    report = store.verify()
    assert report.ok, report


def test_a_retry_under_the_same_key_takes_the_key_over_from_its_failed_original(store: Store) -> None:
    failed(store)

    retry = store.admit(call_request(tool_call_id="re", retry=link(same_key=True), now=LATER))

    assert retry.kind == "new" and retry.owns_dispatch
    holder = store.find_call_by_key("acme", "alice", "key-1")
    assert holder is not None and holder.tool_call_id == "re"
    report = store.verify()
    assert report.ok, report


def test_a_retry_asked_for_under_a_new_key_never_takes_the_originals_key(store: Store) -> None:
    failed(store)

    with pytest.raises(StoreError):
        store.admit(call_request(tool_call_id="re", retry=link(same_key=False), now=LATER))

    holder = store.find_call_by_key("acme", "alice", "key-1")
    assert holder is not None and holder.tool_call_id == "orig"


def test_a_completed_call_is_not_retried_and_nothing_is_recorded(store: Store) -> None:
    store.admit(call_request(tool_call_id="orig"))
    store.record_outcome(outcome("orig", "completed", now=NOW, result={"ok": True}))
    before = len(store.events())

    with pytest.raises(RetryRefused) as refused:
        store.admit(call_request(tool_call_id="re", idempotency_key="k:retry-1", retry=link()))

    assert refused.value.reason == "retry_not_failed"
    assert len(store.events()) == before
    assert store.get_call("re") is None


def test_a_call_is_retried_once_its_retry_is_what_is_retried_next(store: Store) -> None:
    failed(store)
    store.admit(call_request(tool_call_id="re", idempotency_key="key-1:retry-1", retry=link()))

    with pytest.raises(RetryRefused) as refused:
        store.admit(call_request(tool_call_id="re2", idempotency_key="key-1:retry-2", retry=link()))

    assert refused.value.reason == "already_retried"
    assert store.verify().ok


def test_a_retry_asked_by_a_revoked_person_is_refused(store: Store) -> None:
    failed(store)
    store.revoke_principal(RevokePrincipal("acme", "carol", revoked_by="admin", now=NOW))

    with pytest.raises(RetryRefused) as refused:
        store.admit(call_request(tool_call_id="re", idempotency_key="key-1:retry-1", retry=link()))

    assert refused.value.reason == "principal_revoked"
    assert not [e for e in store.events(tool_call_id="orig") if e.type == "tool_call.retry_requested"]


def test_a_retry_in_a_stopped_run_is_recorded_and_refused_run_stopped(store: Store) -> None:
    failed(store)
    store.stop_run(StopRun("run-1", stopped_by="carol", reason="halt", now=NOW, tenant="acme"))

    retry = store.admit(
        call_request(tool_call_id="re", idempotency_key="key-1:retry-1", retry=link(), now=LATER)
    )

    assert (retry.call.status, retry.call.reason) == ("denied", "run_stopped")
    assert any(e.type == "tool_call.retry_requested" for e in store.events(tool_call_id="orig"))
    assert store.verify().ok


def test_of_two_retries_of_one_call_at_once_exactly_one_is_admitted(store: Store) -> None:
    failed(store)

    def retry(n: int) -> str:
        try:
            store.admit(call_request(tool_call_id=f"re{n}", idempotency_key=f"key-1:retry-{n}", retry=link()))
        except RetryRefused as refused:
            return refused.reason
        return "admitted"

    outcomes = at_once(retry, range(4))

    assert sorted(outcomes) == ["admitted", "already_retried", "already_retried", "already_retried"]
    asked = [e for e in store.events(tool_call_id="orig") if e.type == "tool_call.retry_requested"]
    assert len(asked) == 1
    assert store.verify().ok


def test_an_unknown_call_is_retried_only_once_settled_as_a_confirmed_failure(store: Store) -> None:
    store.admit(call_request(tool_call_id="orig"))
    store.record_outcome(outcome("orig", "unknown", now=NOW))

    with pytest.raises(RetryRefused) as unknown:
        store.admit(call_request(tool_call_id="re", retry=link(same_key=True), now=LATER))
    store.resolve_manually(
        ResolveManually("orig", succeeded=False, evidence="no refund at the bank", by="carol", now=LATER)
    )
    retry = store.admit(call_request(tool_call_id="re", retry=link(same_key=True), now=LATER))

    assert unknown.value.reason == "retry_not_failed"
    settled = store.get_call("orig")
    assert settled is not None and settled.verification_status == "confirmed_failure"
    assert retry.owns_dispatch
    report = store.verify()
    assert report.ok, report
