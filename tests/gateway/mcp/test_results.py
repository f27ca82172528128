"""Which recorded words reach the client as a policy rule's `message`, and as what the backend said
of an unknown call's effect (gateway/mcp/results.py).

Pure shaping of a call's recorded state; what the real gateway answers is in test_mcp_shaping.py.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

import pytest

from gateway.mcp.results import (
    FAILED_BY,
    UNKNOWN_BY,
    rule_message,
    shape_call,
    status_document,
    unknown_detail,
)
from store.model import CallView, StoredEvent

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
SAYS = "Goodwill refunds are approved by a supervisor."
PENDING = CallView(
    tool_call_id="tc-1",
    run_id=None,
    tenant="acme",
    subject="alice",
    tool_name="refund_order",
    capability_id="refund-order",
    capability_version="2",
    action_hash="h",
    idempotency_key="k",
    key_source="client",
    status="approval_pending",
    verification_status="not_observed",
    decision_effect="require_approval",
    reason="goodwill_refund",
    policy_version="p1",
    arguments={},
    summary="refund 20 EUR to order 1001",
    external_request_id="x",
    approval_id="ap-1",
    result=None,
    error=None,
    created_at=NOW,
    updated_at=NOW,
)


def decision(**changes: Any) -> dict[str, Any]:
    """A `require_approval` decision as `tool_call.requested` records it."""
    recorded = {
        "effect": "require_approval",
        "reason": "goodwill_refund",
        "policy_version": "p1",
        "rule_id": "goodwill-refunds-need-approval",
        "approval": {"approver_role": "approver", "expires_in_s": 3600, "requester_may_approve": False},
        "message": SAYS,
    }
    return recorded | changes


def test_a_pending_approval_carries_its_rules_message_in_the_document_and_the_text() -> None:
    shaped = shape_call(PENDING, decision=decision())
    assert shaped["structuredContent"]["message"] == SAYS
    assert shaped["content"][0]["text"].startswith(
        f"Waiting for human approval: refund 20 EUR to order 1001. The policy says: {SAYS} Do not call"
    )
    assert status_document(PENDING, decision=decision())["message"] == SAYS


@pytest.mark.parametrize(
    ("call", "recorded"),
    [
        # No decision read (the log could not be read, or the caller did not look): nothing to say.
        (PENDING, None),
        # The rule has no message.
        (PENDING, decision(message=None)),
        (PENDING, decision(message="  ")),
        # A budget sent the call to a person: Writ's reason, and Writ's sentence for the approver.
        (
            dataclasses.replace(PENDING, reason="budget_exceeded"),
            decision(reason="budget_exceeded", message="budget 'b' is used up: a person decides"),
        ),
        # Recorded before a rule's message was kept apart from Writ's account of the match.
        (PENDING, decision(message="decided by rule 'goodwill-refunds-need-approval' (also matched: x)")),
        # A decision that is not the one the call's row was recorded with.
        (PENDING, decision(reason="another_reason")),
        # Not waiting for approval (any more): the decision's message is not the state's.
        (dataclasses.replace(PENDING, status="approved"), decision()),
        (dataclasses.replace(PENDING, status="rejected"), decision()),
    ],
)
def test_no_message_is_told_where_no_rule_said_one_for_the_calls_state(
    call: CallView, recorded: dict[str, Any] | None
) -> None:
    assert rule_message(call, recorded) is None
    shaped = shape_call(call, decision=recorded)
    assert "message" not in shaped["structuredContent"]
    assert "policy says" not in shaped["content"][0]["text"]


def test_a_denial_by_a_rule_keeps_telling_its_message_from_the_call_and_writs_own_none() -> None:
    denied = dataclasses.replace(PENDING, status="denied", reason="amount_over_limit", error="Not by agents.")
    assert rule_message(denied) == "Not by agents."
    assert status_document(denied)["message"] == "Not by agents."
    conflict = dataclasses.replace(denied, reason="idempotency_conflict", error="key is held by tc-0")
    assert rule_message(conflict) is None


UNKNOWN = dataclasses.replace(
    PENDING,
    status="result_unknown",
    verification_status="pending",
    decision_effect="allow",
    reason=None,
    approval_id=None,
    error="tool_error",
    attempts=1,
)


def unknown_event(seq: int, error: str, detail: str | None) -> StoredEvent:
    """A `tool_call.result_unknown` as the log holds it."""
    payload = {"error": error, "detail": detail, "evidence": {}, "reconciliation": "pending"}
    return StoredEvent(
        seq, f"e{seq}", "tool_call.result_unknown", 2, "t", "gw", None, "tc-1", None, None, None, None, None,
        None, "acme", payload, "0" * 64, "0" * 64,
    )  # fmt: skip


def test_the_latest_unknown_outcomes_detail_is_what_the_backend_said() -> None:
    events = [
        unknown_event(1, "response_timeout", "no answer within 0.5s"),
        unknown_event(2, "http_409", "payments answered 409: a request with this key is in progress"),
    ]
    assert unknown_detail(events) == "payments answered 409: a request with this key is in progress"
    assert unknown_detail([*events, unknown_event(3, "response_timeout", None)]) is None
    assert unknown_detail([]) is None


def test_an_upstream_tool_error_left_unknown_tells_the_tools_message_and_not_that_nothing_answered() -> None:
    shaped = shape_call(UNKNOWN, detail="Error executing tool transfer")

    document = shaped["structuredContent"]
    assert (shaped["isError"], document["status"]) == (False, "result_unknown")
    assert document["detail"] == "Error executing tool transfer"
    assert document["next"] == UNKNOWN_BY["tool_error"]
    assert shaped["content"][0]["text"] == (
        "Outcome unknown: refund 20 EUR to order 1001: the tool reported an error, possibly after it "
        f"acted. It said: Error executing tool transfer {UNKNOWN_BY['tool_error']}"
    )


@pytest.mark.parametrize(
    ("error", "attempts"),
    [("tool_error", 1), ("http_409", 3)],
    ids=["a-tool-error", "re-sends-answered-409"],
)
def test_an_escalated_call_the_backend_answered_is_not_told_it_never_answered(
    error: str, attempts: int
) -> None:
    # Reconciliation gave up on a call the backend did answer, with an error or with refusals.
    escalated = dataclasses.replace(
        UNKNOWN, error=error, attempts=attempts, verification_status="inconclusive"
    )

    document = shape_call(escalated, detail="it said something")["structuredContent"]

    assert document["reconciliation"] == "escalated"
    assert "never answered" not in document["next"]
    assert "a person is checking" in document["next"]


@pytest.mark.parametrize("settled_by", sorted(FAILED_BY))
def test_a_failure_settled_after_an_unknown_outcome_does_not_say_the_backend_never_answered(
    settled_by: str,
) -> None:
    # The unknown outcome may have been a tool's error, which the backend did answer: the settled
    # failure says only that the outcome was not known, and how it was learned.
    failed = dataclasses.replace(
        UNKNOWN, status="failed", error=settled_by, verification_status="confirmed_failure"
    )

    document = shape_call(failed)["structuredContent"]

    assert document["next"] == FAILED_BY[settled_by]
    assert "never answered" not in document["next"]
    assert "not known when it was made" in document["next"]


def test_a_re_sent_call_left_unknown_says_how_often_it_was_sent_and_the_last_answer() -> None:
    refused = dataclasses.replace(UNKNOWN, error="http_409", attempts=3)

    shaped = shape_call(refused, detail="payments answered 409: in progress")

    assert shaped["content"][0]["text"].startswith(
        "Outcome unknown: refund 20 EUR to order 1001 was sent 3 times under the same key, and no answer "
        "settled it (http_409). It said: payments answered 409: in progress Do not call again"
    )
    assert status_document(refused, detail="payments answered 409: in progress")["detail"] == (
        "payments answered 409: in progress"
    )
    # A detail is what the backend said of an unknown call: a settled call has its result or error.
    assert "detail" not in status_document(dataclasses.replace(refused, status="failed"), detail="x")
