"""Loop marks: counted and checked in the admission transaction, so a burst never passes a threshold,
and a pattern found to loop is recorded once (`loop.detected`) however often it is refused after."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

from sqlalchemy import func, select

from store import Admission, LoopKey, Store
from store.commands import ResumeRun
from store.schema import loop_marks
from tests.store.builders import NOW, REQUIRE_APPROVAL, call_request, outcome
from tests.store.racing import at_once
from tests.store.test_read_records import answered, read_request

START = NOW.replace(minute=0, second=0, microsecond=0)


def _loop(threshold: int, pattern: str = "pattern-a") -> tuple[LoopKey, ...]:
    return (
        LoopKey("same-refund", "near_identical", pattern, threshold, 3600, START, START + timedelta(hours=1)),
    )


def _admit(store: Store, n: int, loops: tuple[LoopKey, ...]) -> Admission:
    return store.admit(call_request(tool_call_id=f"tc-{n}", idempotency_key=f"k-{n}", loops=loops))


def _detected(store: Store) -> list[dict[str, Any]]:
    return [e.payload for e in store.events() if e.type == "loop.detected"]


def test_the_threshold_is_admitted_exactly_and_the_loop_recorded_once(store: Store) -> None:
    admissions = [_admit(store, n, _loop(threshold=3)) for n in range(6)]

    assert [a.call.status for a in admissions] == ["dispatching"] * 3 + ["denied"] * 3
    assert all(a.call.reason == "loop_detected" and a.loop is not None for a in admissions[3:])
    first = admissions[3].loop
    assert first is not None and first.first
    assert first.tool_call_ids == ("tc-0", "tc-1", "tc-2")
    assert all(a.loop is not None and not a.loop.first for a in admissions[4:])
    (detected,) = _detected(store)
    assert detected["rule"] == "same-refund"
    assert (detected["kind"], detected["threshold"], detected["count"]) == ("near_identical", 3, 3)
    assert detected["tool_call_ids"] == ["tc-0", "tc-1", "tc-2"]
    assert detected["resets_at"] == "2026-11-30T13:00:00.000000Z"
    events = [e for e in store.events() if e.tool_call_id == "tc-3"]
    assert [e.type for e in events] == ["tool_call.requested", "loop.detected", "tool_call.denied"]
    assert events[1].causation_id == events[0].event_id
    assert events[2].payload["reason"] == "loop_detected"
    later = [e.type for e in store.events() if e.tool_call_id == "tc-5"]
    assert later == ["tool_call.requested", "tool_call.denied"]
    assert store.verify().ok


def test_twenty_concurrent_identical_calls_admit_exactly_the_threshold(store: Store) -> None:
    admissions = at_once(lambda n: _admit(store, n, _loop(threshold=10)), range(20))

    admitted = [a for a in admissions if a.call.status == "dispatching"]
    refused = [a for a in admissions if a.call.status == "denied"]
    assert (len(admitted), len(refused)) == (10, 10)
    assert all(a.call.reason == "loop_detected" for a in refused)
    (detected,) = _detected(store)
    assert set(detected["tool_call_ids"]) == {a.call.tool_call_id for a in admitted}
    assert store.verify().ok


def test_another_pattern_and_a_call_with_no_pattern_are_not_refused(store: Store) -> None:
    for n in range(2):
        _admit(store, n, _loop(threshold=2))
    assert _admit(store, 2, _loop(threshold=2)).call.reason == "loop_detected"

    assert _admit(store, 3, _loop(threshold=2, pattern="pattern-b")).call.status == "dispatching"
    assert _admit(store, 4, ()).call.status == "dispatching"


def test_a_refused_call_and_a_joined_call_count_in_no_pattern(store: Store) -> None:
    first = store.admit(call_request(tool_call_id="tc-1", idempotency_key="same", loops=_loop(threshold=1)))
    joined = store.admit(call_request(tool_call_id="tc-2", idempotency_key="same", loops=_loop(threshold=1)))

    assert (first.call.status, joined.kind) == ("dispatching", "joined")
    with store.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(loop_marks)).scalar_one() == 1


def test_rebuild_marks_the_same_calls_and_detections_again(store: Store) -> None:
    for n in range(4):
        _admit(store, n, _loop(threshold=2))

    def marks() -> list[tuple[str, str, str]]:
        with store.engine.connect() as conn:
            rows = conn.execute(
                select(loop_marks.c.pattern_key, loop_marks.c.tool_call_id, loop_marks.c.kind)
            )
            return sorted((r.pattern_key, r.tool_call_id, r.kind) for r in rows)

    before = marks()
    store.rebuild()

    assert before == [
        ("pattern-a", "tc-0", "call"),
        ("pattern-a", "tc-1", "call"),
        ("pattern-a", "tc-2", "detected"),
    ]
    assert marks() == before
    assert store.verify().ok
    # Still found after the rebuild: the next call is refused without another loop.detected.
    assert _admit(store, 9, _loop(threshold=2)).call.reason == "loop_detected"
    assert len(_detected(store)) == 1


def test_a_read_of_a_looping_pattern_is_not_admissible_and_its_answer_not_kept(store: Store) -> None:
    for n in range(2):
        assert (
            store.record_read(answered(read_request(n, loops=_loop(threshold=2)))).call.status == "completed"
        )

    assert not store.admissible_read(read_request(2, loops=_loop(threshold=2)))
    refused = store.record_read(answered(read_request(3, loops=_loop(threshold=2))))
    assert refused.call.reason == "loop_detected" and refused.call.result is None
    assert refused.loop is not None and refused.loop.tool_call_ids == ("tc-read-0", "tc-read-1")
    assert len(_detected(store)) == 1


def _failures(threshold: int) -> tuple[LoopKey, ...]:
    end = START + timedelta(hours=1)
    return (LoopKey("same-failure", "repeated_failure", "pattern-f", threshold, 3600, START, end),)


def _failed(store: Store, n: int, error: str) -> None:
    assert _admit(store, n, _failures(threshold=3)).call.status == "dispatching"
    store.record_outcome(outcome(f"tc-{n}", "failed", error=error, now=NOW))


def test_calls_failing_with_one_error_threshold_times_stop_the_next(store: Store) -> None:
    _failed(store, 0, "http_404")
    _failed(store, 1, "http_500")
    _failed(store, 2, "http_404")
    # Two failures with each error so far, and a call in flight or completed counts none.
    assert _admit(store, 3, _failures(threshold=3)).call.status == "dispatching"
    store.record_outcome(outcome("tc-3", "completed", result={"ok": 1}, now=NOW))
    _failed(store, 4, "http_404")

    refused = _admit(store, 5, _failures(threshold=3))

    assert refused.call.reason == "loop_detected"
    assert refused.loop is not None and refused.loop.tool_call_ids == ("tc-0", "tc-2", "tc-4")
    (detected,) = _detected(store)
    assert (detected["kind"], detected["error"]) == ("repeated_failure", "http_404")
    assert _admit(store, 6, _failures(threshold=3)).call.reason == "loop_detected"
    assert len(_detected(store)) == 1
    assert store.verify().ok


def _pausing(threshold: int) -> tuple[LoopKey, ...]:
    (key,) = _loop(threshold)
    return (dataclasses.replace(key, rule_id="pause-on-loop", action="pause_run"),)


def test_a_pausing_rule_refuses_the_call_and_stops_its_run_withdrawing_its_approvals(store: Store) -> None:
    waiting = call_request(tool_call_id="waiting", idempotency_key="k-w", decision=REQUIRE_APPROVAL)
    store.admit(waiting)
    for n in range(3):
        _admit(store, n, _pausing(threshold=3))

    found = _admit(store, 3, _pausing(threshold=3))
    later = store.admit(call_request(tool_call_id="later", idempotency_key="k-later"))

    assert (found.call.status, found.call.reason) == ("denied", "loop_detected")
    assert found.loop is not None and found.loop.paused_run == "run-1"
    assert "Writ stopped run run-1" in store.events(tool_call_id="tc-3")[-1].payload["message"]
    run = store.get_run("run-1")
    assert run is not None and (run.status, run.stopped_by) == ("stopped", "writ")
    assert run.stop_reason is not None and "pause-on-loop" in run.stop_reason
    assert "tc-0, tc-1, tc-2" in run.stop_reason
    stopped = next(e for e in store.events(run_id="run-1") if e.type == "run.stopped")
    assert stopped.causation_id == store.events(tool_call_id="tc-3")[-1].event_id
    assert stopped.payload["withdrawn"] == [waiting.approval_id]
    assert waiting.approval_id is not None
    approval = store.get_approval(waiting.approval_id)
    assert approval is not None and (approval.status, approval.decided_by) == ("rejected", "writ")
    assert (later.call.status, later.call.reason) == ("denied", "run_stopped")

    store.resume_run(ResumeRun("run-1", resumed_by="carol", reason="looked at it", now=NOW, tenant="acme"))
    again = store.admit(call_request(tool_call_id="again", idempotency_key="k-again"))
    assert again.owns_dispatch
    resumed = store.get_run("run-1")
    store.rebuild()
    assert resumed is not None and store.get_run("run-1") == resumed
    assert store.verify().ok


def test_a_pausing_rule_only_refuses_a_call_in_no_run(store: Store) -> None:
    admissions = [
        store.admit(
            call_request(tool_call_id=f"tc-{n}", idempotency_key=f"k-{n}", run_id=None, loops=_pausing(2))
        )
        for n in range(3)
    ]

    refused = admissions[2]
    assert (refused.call.status, refused.call.reason) == ("denied", "loop_detected")
    assert refused.loop is not None and refused.loop.paused_run is None
    assert "run.stopped" not in [e.type for e in store.events()]
    assert store.verify().ok


def test_a_pausing_rule_stops_the_run_of_a_read_found_looping_at_its_commit(store: Store) -> None:
    for n in range(2):
        store.record_read(answered(read_request(n, run_id="run-r", loops=_pausing(2))))

    refused = store.record_read(answered(read_request(2, run_id="run-r", loops=_pausing(2))))

    assert (refused.call.reason, refused.call.result) == ("loop_detected", None)
    run = store.get_run("run-r")
    assert run is not None and (run.status, run.stopped_by) == ("stopped", "writ")
    assert store.verify().ok
