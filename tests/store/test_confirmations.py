"""The confirmation leg: a call of a `confirm` capability waits for the user's answer, consumed once."""

from __future__ import annotations

from datetime import timedelta

import pytest

from store import ConfirmationAnswer, ConfirmationMismatch, NotFound, StaleLease, Store
from tests.store.builders import NOW, call_request, outcome

SOON = NOW + timedelta(minutes=1)
LATER = NOW + timedelta(minutes=11)


def awaiting(store: Store, tool_call_id: str = "tc-1") -> None:
    store.admit(
        call_request(
            tool_call_id=tool_call_id,
            confirmation_id="cf-1",
            confirmation_expires_at=NOW + timedelta(minutes=10),
        )
    )


def answer(store: Store, action: str = "accept", **changes: object) -> object:
    args: dict[str, object] = {
        "confirmation_id": "cf-1",
        "action_hash": "action-a",
        "action": action,
        "answered_by": "alice",
        "now": SOON,
        **changes,
    }
    return store.answer_confirmation(ConfirmationAnswer("tc-1", **args))  # type: ignore[arg-type]


def test_an_allowed_call_that_needs_confirmation_is_recorded_awaiting_it_and_not_dispatched(
    store: Store,
) -> None:
    awaiting(store)

    call = store.get_call("tc-1")
    assert call is not None
    assert (call.status, call.confirmation_id, call.attempts) == ("awaiting_confirmation", "cf-1", 0)
    assert [e.type for e in store.events(tool_call_id="tc-1")] == [
        "tool_call.requested",
        "confirmation.required",
    ]
    assert store.find_call_by_key("acme", "alice", "key-1") == call


def test_accepting_moves_the_call_to_dispatching_once_and_a_second_answer_is_refused(store: Store) -> None:
    awaiting(store)

    dispatched = answer(store)
    assert (dispatched.status, dispatched.attempts, dispatched.lease_token) == ("dispatching", 1, 1)  # type: ignore[attr-defined]
    with pytest.raises(StaleLease):
        answer(store)
    with pytest.raises(StaleLease):
        answer(store, "decline")
    done = store.record_outcome(outcome("tc-1", "completed", now=SOON))
    assert done.status == "completed"
    assert [e.type for e in store.events(tool_call_id="tc-1")] == [
        "tool_call.requested",
        "confirmation.required",
        "confirmation.given",
        "tool_call.dispatching",
        "tool_call.completed",
    ]


@pytest.mark.parametrize(("action", "reason"), [("decline", "user_declined"), ("cancel", "user_cancelled")])
def test_declining_or_cancelling_denies_the_call_and_nothing_is_dispatched(
    store: Store, action: str, reason: str
) -> None:
    awaiting(store)

    denied = answer(store, action)
    assert (denied.status, denied.reason, denied.attempts) == ("denied", reason, 0)  # type: ignore[attr-defined]
    with pytest.raises(StaleLease):
        answer(store)
    assert store.events(tool_call_id="tc-1")[-1].type == "confirmation.declined"


def test_an_answer_bound_to_another_action_or_confirmation_is_refused_and_records_nothing(
    store: Store,
) -> None:
    awaiting(store)
    before = len(store.events())

    with pytest.raises(ConfirmationMismatch):
        answer(store, action_hash="action-b")
    with pytest.raises(ConfirmationMismatch):
        answer(store, confirmation_id="cf-2")
    with pytest.raises(NotFound):
        store.answer_confirmation(
            ConfirmationAnswer(
                "tc-x",
                confirmation_id="cf-1",
                action_hash="action-a",
                action="accept",
                answered_by="a",
                now=SOON,
            )
        )
    assert len(store.events()) == before
    assert store.get_call("tc-1").status == "awaiting_confirmation"  # type: ignore[union-attr]


def test_an_answer_at_or_after_the_expiry_is_refused_and_the_worker_expires_the_call(store: Store) -> None:
    awaiting(store)

    with pytest.raises(StaleLease):
        answer(store, now=NOW + timedelta(minutes=10))
    assert store.expire_confirmations(now=SOON) == []
    expired = store.expire_confirmations(now=LATER)
    assert [(c.tool_call_id, c.status, c.reason) for c in expired] == [
        ("tc-1", "expired", "confirmation_expired")
    ]
    with pytest.raises(StaleLease):
        answer(store, now=LATER)


def test_an_identical_call_with_the_same_key_joins_the_call_awaiting_confirmation(store: Store) -> None:
    awaiting(store)

    joined = store.admit(
        call_request(tool_call_id="tc-2", confirmation_id="cf-2", confirmation_expires_at=LATER)
    )
    assert (joined.kind, joined.call.tool_call_id) == ("joined", "tc-1")


def test_rebuild_replays_confirmations_into_the_same_projection(store: Store) -> None:
    awaiting(store)
    answer(store, "decline")
    before = store.get_call("tc-1")

    store.rebuild()
    assert store.get_call("tc-1") == before
