"""Beside an approval: its held arguments and its outbox notification, written with `approval.required`."""

from __future__ import annotations

from datetime import timedelta

from store import ApprovedDenial, Store
from store.commands import (
    ClaimOutbox,
    DecideApproval,
    EnqueueOutbox,
    ExpireApproval,
    OutboxDelivered,
    OutboxFailed,
)
from tests.store.builders import NOW, REQUIRE_APPROVAL, call_request

SOON = NOW + timedelta(minutes=5)
FULL = {"order": 1001, "amount": "250.00", "iban": "DE89370400440532013000"}
NOTE = {"approvalId": "set-by-test", "summary": "refund 250.00 EUR to order 1001"}


def pending(store: Store, tool_call_id: str = "tc-1", key: str = "key-1") -> str:
    request = call_request(
        tool_call_id=tool_call_id,
        idempotency_key=key,
        decision=REQUIRE_APPROVAL,
        held_arguments=FULL,
        notification=NOTE,
    )
    store.admit(request)
    assert request.approval_id is not None
    return request.approval_id


def test_an_approval_holds_the_full_arguments_until_it_is_rejected(store: Store) -> None:
    approval_id = pending(store)
    assert store.held_arguments(approval_id) == FULL

    store.decide_approval(DecideApproval(approval_id, approve=False, decided_by="bob", now=SOON))

    assert store.held_arguments(approval_id) is None


def test_expiring_or_refusing_an_approved_call_releases_its_held_arguments(store: Store) -> None:
    expiring = pending(store, "tc-1", "key-1")
    refused = pending(store, "tc-2", "key-2")
    store.expire_approval(ExpireApproval(expiring, now=NOW + timedelta(hours=2)))
    store.decide_approval(DecideApproval(refused, approve=True, decided_by="bob", now=SOON))
    store.deny_approved(ApprovedDenial("tc-2", reason="policy_changed", now=SOON))

    assert store.held_arguments(expiring) is None and store.held_arguments(refused) is None


def test_a_call_admitted_without_approval_holds_nothing_and_queues_nothing(store: Store) -> None:
    store.admit(call_request(held_arguments=FULL, notification=NOTE))

    assert store.outbox_messages() == []


def test_the_notification_is_queued_in_the_approvals_transaction(store: Store) -> None:
    approval_id = pending(store)

    [message] = store.outbox_messages()
    assert (message.topic, message.approval_id, message.tool_call_id) == (
        "approval.required",
        approval_id,
        "tc-1",
    )
    assert (message.status, message.attempts, message.payload) == ("pending", 0, NOTE)


def test_a_claimed_message_is_not_claimed_again_until_its_lease_runs_out(store: Store) -> None:
    pending(store)

    [claimed] = store.claim_outbox(ClaimOutbox(owner="w1", now=NOW, lease_s=30))
    assert claimed.attempts == 1 and claimed.lease_owner == "w1"
    assert store.claim_outbox(ClaimOutbox(owner="w2", now=NOW + timedelta(seconds=10))) == []
    [again] = store.claim_outbox(ClaimOutbox(owner="w2", now=NOW + timedelta(seconds=31)))
    assert again.attempts == 2
    assert not store.outbox_delivered(OutboxDelivered(claimed.message_id, owner="w1", now=NOW))  # fenced out


def test_a_failed_attempt_is_retried_after_its_backoff_then_delivered(store: Store) -> None:
    pending(store)
    [message] = store.claim_outbox(ClaimOutbox(owner="w1", now=NOW))

    assert store.outbox_failed(
        OutboxFailed(
            message.message_id, owner="w1", error="http 503", retry_at=NOW + timedelta(seconds=2), now=NOW
        )
    )
    assert store.claim_outbox(ClaimOutbox(owner="w1", now=NOW + timedelta(seconds=1))) == []
    [retry] = store.claim_outbox(ClaimOutbox(owner="w1", now=NOW + timedelta(seconds=2)))
    assert retry.last_error == "http 503"
    assert store.outbox_delivered(
        OutboxDelivered(retry.message_id, owner="w1", now=NOW + timedelta(seconds=3))
    )

    [done] = store.outbox_messages(status="delivered")
    assert (done.attempts, done.delivered_at) == (2, NOW + timedelta(seconds=3))
    assert store.claim_outbox(ClaimOutbox(owner="w1", now=NOW + timedelta(hours=1))) == []


def test_a_message_given_up_on_is_dead_and_stays_visible(store: Store) -> None:
    pending(store)
    [message] = store.claim_outbox(ClaimOutbox(owner="w1", now=NOW))

    store.outbox_failed(
        OutboxFailed(message.message_id, owner="w1", error="http 410", retry_at=None, now=NOW)
    )

    [dead] = store.outbox_messages(status="dead")
    assert (dead.last_error, dead.attempts) == ("http 410", 1)


def test_approvals_past_their_expiry_are_due(store: Store) -> None:
    approval_id = pending(store)

    assert store.due_approvals(now=SOON) == []
    assert [a.approval_id for a in store.due_approvals(now=NOW + timedelta(hours=1))] == [approval_id]


def test_a_message_announcing_no_call_is_queued_once_and_claimed_by_its_topic_only(store: Store) -> None:
    approval_id = pending(store)
    checkpoint = EnqueueOutbox("ckpt_1", "audit.checkpoint", {"seq": 4, "checkpoint": "a.b.c"}, NOW)

    assert store.enqueue_outbox(checkpoint)
    assert not store.enqueue_outbox(checkpoint)  # the same id again: already queued, nothing added
    [approvals] = store.claim_outbox(ClaimOutbox(owner="w1", now=NOW, topics=("approval.required",)))
    [checkpoints] = store.claim_outbox(ClaimOutbox(owner="w2", now=NOW, topics=("audit.checkpoint",)))

    assert approvals.approval_id == approval_id
    assert (checkpoints.message_id, checkpoints.tool_call_id, checkpoints.tenant) == ("ckpt_1", None, "")
    assert checkpoints.payload == {"seq": 4, "checkpoint": "a.b.c"}
    assert store.outbox_delivered(OutboxDelivered("ckpt_1", owner="w2", now=NOW))
    assert len(store.outbox_messages()) == 2
