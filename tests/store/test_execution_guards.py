"""Budgets and loops checked again when an approved call runs (`dispatch_approved`), on both stores:
under the head lock as at admission; a counter the call was charged on when admitted holds it already,
any other must still have room; a pattern found looping since refuses it."""

from __future__ import annotations

from datetime import timedelta

from store import ApprovedDispatch, Store
from store.commands import DecideApproval
from store.model import Charge, LoopKey
from tests.store.builders import NOW, REQUIRE_APPROVAL, call_request

LATER = NOW + timedelta(hours=2)


def charge(key: str, limit: int = 2) -> Charge:
    return Charge("refunds", key, amount_micros=1_000_000, limit_micros=limit * 1_000_000, scope="principal")


def approved(store: Store, tool_call_id: str, **changes: object) -> None:
    request = call_request(
        tool_call_id=tool_call_id, idempotency_key=f"k-{tool_call_id}", decision=REQUIRE_APPROVAL, **changes
    )
    store.admit(request)
    assert request.approval_id is not None
    store.decide_approval(DecideApproval(request.approval_id, approve=True, decided_by="bob", now=NOW))


def used(store: Store, key: str) -> int:
    return store.budget_use([key]).get(key, 0)


def test_a_counter_charged_at_admission_is_not_charged_again_when_the_call_runs(store: Store) -> None:
    approved(store, "a", charges=(charge("window-1"),))

    claimed = store.dispatch_approved(ApprovedDispatch("a", now=LATER, charges=(charge("window-1"),)))

    assert claimed.status == "dispatching"
    assert used(store, "window-1") == 1_000_000
    assert store.events(tool_call_id="a")[-1].payload.get("charges") is None
    assert store.verify().ok


def test_a_counter_new_since_admission_is_charged_when_the_call_runs_and_replays(store: Store) -> None:
    approved(store, "a", charges=(charge("window-1"),))

    claimed = store.dispatch_approved(ApprovedDispatch("a", now=LATER, charges=(charge("window-2"),)))

    assert claimed.status == "dispatching"
    assert used(store, "window-2") == 1_000_000
    assert [c["key"] for c in store.events(tool_call_id="a")[-1].payload["charges"]] == ["window-2"]
    assert store.verify().ok
    store.rebuild()
    assert used(store, "window-2") == 1_000_000


def test_an_approved_call_is_refused_budget_exceeded_when_its_new_counter_is_full(store: Store) -> None:
    approved(store, "a", charges=(charge("window-1"),))
    for n in range(2):
        store.admit(
            call_request(tool_call_id=f"fill-{n}", idempotency_key=f"f{n}", charges=(charge("window-2"),))
        )

    refused = store.dispatch_approved(ApprovedDispatch("a", now=LATER, charges=(charge("window-2"),)))

    assert (refused.status, refused.reason) == ("denied", "budget_exceeded")
    assert [e.type for e in store.events(tool_call_id="a")][-2:] == ["budget.exceeded", "tool_call.denied"]
    assert used(store, "window-2") == 2_000_000
    assert store.verify().ok


def test_an_approved_call_whose_pattern_was_found_looping_since_is_refused(store: Store) -> None:
    end = NOW + timedelta(hours=1)
    key = LoopKey("same-refund", "repeated_action", "pattern-a", 2, 3600, NOW, end)
    approved(store, "a", loops=(key,))
    store.admit(call_request(tool_call_id="b", idempotency_key="kb", loops=(key,)))
    looping = store.admit(call_request(tool_call_id="c", idempotency_key="kc", loops=(key,)))
    assert looping.call.reason == "loop_detected"

    refused = store.dispatch_approved(ApprovedDispatch("a", now=NOW, loops=(key,)))

    assert (refused.status, refused.reason) == ("denied", "loop_detected")
    assert store.verify().ok
