"""The event grammar on its own, over events built in memory: every event type has a place in it, and
the guards that a state name cannot hold (who may approve, who holds a key) decide as the store does."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from store import events as ev
from store.grammar import CALL_FREE_TYPES, TRANSITIONS, Grammar
from store.keys import scoped_key
from store.model import GrammarViolation
from tests.store.builders import NOW

AT = ev.format_ts(NOW)


def test_every_event_type_has_a_place_in_the_grammar() -> None:
    placed = {event_type for _, event_type in TRANSITIONS} | CALL_FREE_TYPES | {"tool_call.requested"}

    assert ev.TYPE_NAMES - placed == set()


def envelope(call: str, seq: int, at: str = AT, **extra: Any) -> dict[str, Any]:
    return {
        "seq": seq,
        "occurred_at": at,
        "producer": "t",
        "run_id": "run-1",
        "tool_call_id": call,
        "tenant": "acme",
        **extra,
    }


def requested(
    call: str, seq: int, *, effect: str = "allow", key: str = "k", at: str = AT, **payload: Any
) -> ev.Event:
    fields: dict[str, Any] = {
        "tool_name": "refund",
        "subject": "alice",
        "arguments": {},
        "action_hash": "a",
        "idempotency_key": key,
        "key_source": "client",
        "claims_key": True,
        "principal": {},
        "decision": {"effect": effect},
        "effect_class": "write",
        "summary": "",
        "external_request_id": "x",
        "dedupe_window_s": 600,
        **payload,
    }
    return ev.ToolCallRequestedEvent(**envelope(call, seq, at), payload=ev.ToolCallRequested(**fields))


def follow(*events: ev.Event) -> GrammarViolation | None:
    grammar = Grammar()
    run = ev.RunStartedEvent(
        **envelope("", 0) | {"tool_call_id": None}, payload=ev.RunStarted(tenant="acme", subject="alice")
    )
    for event in (run, *events):
        violation = grammar.check(event)
        if violation is not None:
            return violation
    return None


def pending(call: str, seq: int, *, requester_may_approve: bool = False) -> list[ev.Event]:
    required = ev.ApprovalRequired(
        approval_id=f"ap-{call}",
        approver_role="finance",
        expires_at=AT,
        requester_may_approve=requester_may_approve,
        action_hash="a",
        requester="alice",
    )
    return [
        requested(call, seq, effect="require_approval"),
        ev.ApprovalRequiredEvent(**envelope(call, seq + 1, approval_id=f"ap-{call}"), payload=required),
    ]


def granted(call: str, seq: int, by: str, **payload: Any) -> ev.Event:
    return ev.ApprovalGrantedEvent(
        **envelope(call, seq, approval_id=f"ap-{call}"), payload=ev.ApprovalDecided(decided_by=by, **payload)
    )


def dispatching(call: str, seq: int, *, key: str = "k", attempt: int = 1) -> ev.Event:
    payload = ev.ToolCallDispatching(attempt=attempt, idempotency_key=key, external_request_id="x")
    return ev.ToolCallDispatchingEvent(**envelope(call, seq), payload=payload)


def test_an_approved_call_dispatches_once() -> None:
    assert follow(*pending("c", 1), granted("c", 3, "carol"), dispatching("c", 4)) is None
    second = follow(
        *pending("c", 1), granted("c", 3, "carol"), dispatching("c", 4), dispatching("c", 5, attempt=2)
    )
    assert second is not None and (second.seq, second.rule) == (5, "second_dispatch")


def test_the_requester_may_approve_only_where_the_rule_said_so() -> None:
    refused = follow(*pending("c", 1), granted("c", 3, "alice"))
    allowed = follow(*pending("c", 1, requester_may_approve=True), granted("c", 3, "alice"))

    assert refused is not None and (refused.seq, refused.rule) == (3, "self_approval")
    assert allowed is None


def test_a_revoked_approver_may_not_approve_unless_by_break_glass() -> None:
    revoked = ev.PrincipalRevokedEvent(
        **envelope("", 3) | {"tool_call_id": None},
        payload=ev.PrincipalRevoked(subject="eve", revoked_by="root"),
    )
    by_eve = follow(*pending("c", 1), revoked, granted("c", 4, "eve"))
    by_glass = follow(*pending("c", 1), revoked, granted("c", 4, "eve", break_glass=True))

    assert by_eve is not None and by_eve.rule == "approval_by_revoked"
    assert by_glass is None


def test_a_derived_key_is_taken_over_only_past_its_holders_dedupe_window() -> None:
    first = requested("c1", 1, key_source="derived")
    done = ev.ToolCallCompletedEvent(**envelope("c1", 3), payload=ev.ToolCallCompleted())
    inside = ev.format_ts(NOW + timedelta(seconds=599))
    outside = ev.format_ts(NOW + timedelta(seconds=601))

    too_soon = follow(
        first,
        dispatching("c1", 2),
        done,
        requested("c2", 4, at=inside, key_source="derived", supersedes="c1"),
    )
    later = follow(
        first,
        dispatching("c1", 2),
        done,
        requested("c2", 4, at=outside, key_source="derived", supersedes="c1"),
    )
    in_flight = follow(
        first, dispatching("c1", 2), requested("c2", 3, at=outside, key_source="derived", supersedes="c1")
    )

    assert too_soon is not None and (too_soon.seq, too_soon.rule) == (4, "key_taken_over_too_soon")
    assert later is None
    assert in_flight is not None and "still dispatching" in in_flight.detail


def test_a_retry_after_an_unknown_outcome_must_say_which_attempt_it_retries() -> None:
    unknown = ev.ToolCallResultUnknownEvent(**envelope("c", 3), payload=ev.ToolCallResultUnknown())
    marked = ev.ToolCallDispatchingEvent(
        **envelope("c", 4),
        payload=ev.ToolCallDispatching(
            attempt=2, idempotency_key="k", external_request_id="x", retry_of_attempt=1
        ),
    )

    assert follow(requested("c", 1), dispatching("c", 2), unknown, marked) is None
    unmarked = follow(requested("c", 1), dispatching("c", 2), unknown, dispatching("c", 4, attempt=2))
    assert unmarked is not None and unmarked.rule == "redispatch_unmarked"


def test_a_dispatch_sends_the_calls_key_plain_or_scoped_to_its_principal_and_no_other() -> None:
    scoped = scoped_key("acme", "alice", "k")

    assert follow(requested("c", 1), dispatching("c", 2, key=scoped)) is None
    assert follow(requested("c", 1), dispatching("c", 2, key="k")) is None  # as before keys were scoped
    for other in ("k2", scoped_key("acme", "bob", "k"), scoped_key("globex", "alice", "k"), "k~" + "0" * 20):
        violation = follow(requested("c", 1), dispatching("c", 2, key=other))
        assert violation is not None and (violation.seq, violation.rule) == (2, "dispatch_under_another_key")


def test_a_re_send_after_an_unknown_outcome_goes_under_the_key_sent_before() -> None:
    unknown = ev.ToolCallResultUnknownEvent(**envelope("c", 3), payload=ev.ToolCallResultUnknown())
    scoped = scoped_key("acme", "alice", "k")

    def resent(key: str) -> ev.Event:
        payload = ev.ToolCallDispatching(
            attempt=2, idempotency_key=key, external_request_id="x", retry_of_attempt=1
        )
        return ev.ToolCallDispatchingEvent(**envelope("c", 4), payload=payload)

    for first in ("k", scoped):
        assert follow(requested("c", 1), dispatching("c", 2, key=first), unknown, resent(first)) is None
        other = "k" if first == scoped else scoped
        changed = follow(requested("c", 1), dispatching("c", 2, key=first), unknown, resent(other))
        assert changed is not None and (changed.seq, changed.rule) == (4, "redispatch_under_another_key")


def test_a_confirm_capability_never_dispatches_unconfirmed() -> None:
    violation = follow(requested("c", 1, effect_class="confirm"), dispatching("c", 2))

    assert violation is not None and (violation.seq, violation.rule) == (2, "dispatch_without_confirmation")


def stopped(seq: int) -> ev.Event:
    return ev.RunStoppedEvent(
        **envelope("", seq) | {"tool_call_id": None}, payload=ev.RunStopped(stopped_by="carol", reason="r")
    )


def resumed(seq: int) -> ev.Event:
    return ev.RunResumedEvent(
        **envelope("", seq) | {"tool_call_id": None}, payload=ev.RunResumed(resumed_by="carol", reason="r")
    )


def test_no_call_of_a_stopped_run_claims_a_key_is_approved_or_runs_until_it_is_resumed() -> None:
    claim = follow(stopped(1), requested("c", 2))
    approval = follow(*pending("c", 1), stopped(3), granted("c", 4, "carol"))
    dispatch = follow(*pending("c", 1), granted("c", 3, "carol"), stopped(4), dispatching("c", 5))

    assert claim is not None and (claim.seq, claim.rule) == (2, "claim_in_stopped_run")
    assert approval is not None and (approval.seq, approval.rule) == (4, "approval_in_stopped_run")
    assert dispatch is not None and (dispatch.seq, dispatch.rule) == (5, "dispatch_in_stopped_run")
    assert follow(stopped(1), resumed(2), requested("c", 3)) is None


def test_a_run_is_stopped_or_resumed_only_from_the_other_state() -> None:
    twice = follow(stopped(1), stopped(2))
    unstopped = follow(resumed(1))

    assert twice is not None and (twice.seq, twice.rule) == (2, "run_control_out_of_order")
    assert unstopped is not None and unstopped.rule == "run_control_out_of_order"


def test_a_call_in_no_run_needs_no_run_started() -> None:
    runless = ev.ToolCallRequestedEvent(
        **{**requested("c", 1).model_dump(), "run_id": None, "type": "tool_call.requested"}
    )

    assert follow(runless, dispatching("c", 2)) is None


def retry_requested(call: str, seq: int, retry: str, *, by: str = "carol", **payload: Any) -> ev.Event:
    fields: dict[str, Any] = {
        "requested_by": by,
        "reason": "fixed",
        "retry_tool_call_id": retry,
        "retry_number": 1,
        "idempotency_key": "k",
        "same_key": True,
        **payload,
    }
    return ev.ToolCallRetryRequestedEvent(**envelope(call, seq), payload=ev.ToolCallRetryRequested(**fields))


def test_only_a_failed_call_is_retried_once_and_its_retry_is_the_call_it_named() -> None:
    failed = ev.ToolCallFailedEvent(**envelope("c", 3), payload=ev.ToolCallFailed(error="no"))
    done = ev.ToolCallCompletedEvent(**envelope("c", 3), payload=ev.ToolCallCompleted())
    base = (requested("c", 1), dispatching("c", 2))
    same_key = requested("r", 5, supersedes="c", retry_of="c", retry_number=1)

    assert follow(*base, failed, retry_requested("c", 4, "r"), same_key, dispatching("r", 6)) is None
    of_completed = follow(*base, done, retry_requested("c", 4, "r"))
    twice = follow(*base, failed, retry_requested("c", 4, "r"), retry_requested("c", 5, "r2"))
    unasked = follow(*base, failed, requested("r", 4, key="k2", retry_of="c"))
    other = follow(*base, failed, retry_requested("c", 4, "r"), requested("x", 5, key="k2", retry_of="c"))
    takeover = follow(*base, failed, requested("r", 4, supersedes="c"))
    new_key_asked = follow(*base, failed, retry_requested("c", 4, "r", same_key=False), same_key)

    assert of_completed is not None and (of_completed.seq, of_completed.rule) == (4, "illegal_transition")
    assert twice is not None and twice.rule == "retried_twice"
    assert unasked is not None and unasked.rule == "retry_unrequested"
    assert other is not None and other.rule == "retry_unrequested"
    assert takeover is not None and takeover.rule == "key_taken_over_too_soon"
    assert new_key_asked is not None and "under a new key" in new_key_asked.detail


def test_whoever_asked_for_a_retry_may_approve_it_only_where_the_rule_said_so() -> None:
    # The store refuses this approval in its transaction; a log written otherwise (by hand, or by a
    # version that did not refuse it) is flagged by the audit as the requester's own approval is.
    failed = ev.ToolCallFailedEvent(**envelope("c", 3), payload=ev.ToolCallFailed(error="no"))
    asked = (requested("c", 1), dispatching("c", 2), failed, retry_requested("c", 4, "r", by="carol"))

    def retry_held(requester_may_approve: bool = False) -> list[ev.Event]:
        [_, required] = pending("r", 5, requester_may_approve=requester_may_approve)
        retry = requested("r", 5, effect="require_approval", supersedes="c", retry_of="c", retry_number=1)
        return [*asked, retry, required]

    by_asker = follow(*retry_held(), granted("r", 7, "carol"))
    by_another = follow(*retry_held(), granted("r", 7, "dave"))
    allowed = follow(*retry_held(requester_may_approve=True), granted("r", 7, "carol"))

    assert by_asker is not None and (by_asker.seq, by_asker.rule) == (7, "self_approval")
    assert by_asker.detail == "carol asked for this retry and approved it"
    assert by_another is None and allowed is None


def test_a_revoked_person_may_not_ask_for_a_retry_unless_by_break_glass() -> None:
    failed = ev.ToolCallFailedEvent(**envelope("c", 3), payload=ev.ToolCallFailed(error="no"))
    revoked = ev.PrincipalRevokedEvent(
        **envelope("", 4) | {"tool_call_id": None},
        payload=ev.PrincipalRevoked(subject="eve", revoked_by="root"),
    )
    base = (requested("c", 1), dispatching("c", 2), failed, revoked)

    by_eve = follow(*base, retry_requested("c", 5, "r", by="eve"))
    by_glass = follow(*base, retry_requested("c", 5, "r", by="eve", break_glass=True))

    assert by_eve is not None and by_eve.rule == "retry_by_revoked"
    assert by_glass is None


def settled_failed_after_horizon(call: str, seq: int, *, recheck_at: str | None) -> list[ev.Event]:
    """Requested, dispatched, unknown, looked up and settled failed (seq .. seq + 4)."""
    resolved = ev.ReconciliationResolved(
        verdict="confirmed_failure", evidence={"verdict": "not_found"}, recheck_at=recheck_at
    )
    return [
        requested(call, seq),
        dispatching(call, seq + 1),
        ev.ToolCallResultUnknownEvent(**envelope(call, seq + 2), payload=ev.ToolCallResultUnknown()),
        ev.ReconciliationStartedEvent(
            **envelope(call, seq + 3), payload=ev.ReconciliationStarted(method="lookup")
        ),
        ev.ReconciliationResolvedEvent(**envelope(call, seq + 4), payload=resolved),
    ]


def recheck(call: str, seq: int, *, method: str = "recheck", next_at: str | None = None) -> list[ev.Event]:
    started = ev.ReconciliationStartedEvent(
        **envelope(call, seq), payload=ev.ReconciliationStarted(method=method)
    )
    done = ev.ReconciliationRechecked(attempt=2, next_recheck_at=next_at)
    return [started, ev.ReconciliationRecheckedEvent(**envelope(call, seq + 1), payload=done)]


def test_a_failed_call_is_rechecked_only_as_scheduled_and_under_a_recheck_lease() -> None:
    # Scheduled by its verdict, then by each re-check, until one names no next.
    assert follow(*settled_failed_after_horizon("c", 1, recheck_at=AT), *recheck("c", 6, next_at=AT)) is None
    after_last = follow(
        *settled_failed_after_horizon("c", 1, recheck_at=AT), *recheck("c", 6), *recheck("c", 8)
    )
    assert after_last is not None and (after_last.seq, after_last.rule) == (8, "recheck_unscheduled")
    unscheduled = follow(*settled_failed_after_horizon("c", 1, recheck_at=None), *recheck("c", 6))
    assert unscheduled is not None and (unscheduled.seq, unscheduled.rule) == (6, "recheck_unscheduled")
    # A plain lookup of a failed call, or a re-check recorded without its lease, is no re-check.
    lookup = follow(*settled_failed_after_horizon("c", 1, recheck_at=AT), *recheck("c", 6, method="lookup"))
    assert lookup is not None and (lookup.seq, lookup.rule) == (6, "recheck_unscheduled")
    leaseless = follow(*settled_failed_after_horizon("c", 1, recheck_at=AT), recheck("c", 6)[1])
    assert leaseless is not None and (leaseless.seq, leaseless.rule) == (7, "recheck_unscheduled")
    # A contradiction ends the re-checks.
    contradicted = ev.ReconciliationContradictedEvent(
        **envelope("c", 6),
        payload=ev.ReconciliationContradicted(
            source="lookup",
            settled_status="failed",
            settled_verification="confirmed_failure",
            verdict="confirmed_success",
        ),
    )
    after = follow(*settled_failed_after_horizon("c", 1, recheck_at=AT), contradicted, *recheck("c", 7))
    assert after is not None and (after.seq, after.rule) == (7, "recheck_unscheduled")
