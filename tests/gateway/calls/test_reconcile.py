"""The reconciler and the lease recovery worker, with a scripted executor and a real store (SQLite and
PostgreSQL)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import pytest
from sqlalchemy import select

from capabilities.contract import Invocation, Outcome, ReconcileResult
from capabilities.fake import FakeExecutor, completed, failed, fake_capability, unknown
from capabilities.registry import Registry
from capabilities.results import json_result
from gateway.calls.actions import Redactor, new_id
from gateway.calls.dispatch import Dispatcher
from gateway.calls.pipeline import CallInput, CallPipeline, CallReport, RegistryLike
from gateway.calls.reconcile import ReconcilePolicy, Reconciler
from gateway.calls.workers import Workers
from gateway.mcp.results import CONTRADICTED, ESCALATED, FAILED_BY, NEXT, shape_call, status_document
from policy.engine import Policy
from policy.model import Principal
from store.commands import ResolveManually
from store.events import format_ts
from store.keys import scoped_key
from store.model import Charge, LoopKey
from store.schema import budget_counters, loop_marks
from store.store import Store
from tests.eventually import eventually
from tests.postgres import fresh_schema
from tests.store import tamper
from tests.store.builders import call_request

pytestmark = pytest.mark.anyio

HORIZON_S = 60.0
LEASE_MARGIN_S = 1.0
HORIZON_END_S = HORIZON_S + LEASE_MARGIN_S
"""The horizon ends `HORIZON_S` after the latest moment a dispatch may have left: the dispatcher sends
only while its whole bounded dispatch fits the lease, up to the lease margin after the record."""
LOOKUP_REFUND = fake_capability("refund_order", timeout_s=0.2, commit_horizon_s=HORIZON_S, reconcilable=True)
DEDUPING = fake_capability("pay_invoice", timeout_s=0.2, dedupes_on_key=True)
BLIND = fake_capability("send_fax", timeout_s=0.2)
# A generous real-time timeout, so the test can move the clock past its lease while it is in flight.
SLOW = fake_capability("slow_refund", timeout_s=30, commit_horizon_s=HORIZON_S, reconcilable=True)
POLICY = Policy.from_mapping(
    {"rules": [{"id": "all", "tools": ["*"], "roles": ["agent"], "decision": "allow"}]}
)
ALICE = Principal("alice", tenant="acme", roles=frozenset({"agent"}))


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 11, 30, 12, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'writ.db'}"
        s = Store.open(url)
        s.migrate()
        yield s
        s.close()
        return
    with fresh_schema(request.getfixturevalue("postgres_url")) as url:
        s = Store.open(url)
        s.migrate()
        yield s
        s.close()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def executor() -> FakeExecutor:
    return FakeExecutor(default=completed({"refund_id": "r1"}))


def dispatcher_of(store: Store, registry: RegistryLike, clock: Clock) -> Dispatcher:
    return Dispatcher(
        store=store,
        registry=registry,
        redactor=Redactor(b"salt"),
        clock=clock,
        executor_grace_s=0.3,
        lease_margin_s=LEASE_MARGIN_S,
    )


@pytest.fixture
def pipeline(store: Store, executor: FakeExecutor, clock: Clock) -> CallPipeline:
    registry = Registry({"fake": executor}, [LOOKUP_REFUND, DEDUPING, BLIND, SLOW])
    p = CallPipeline(
        store=store,
        registry=registry,
        policy=lambda: POLICY,
        redactor=Redactor(b"salt"),
        dispatcher=dispatcher_of(store, registry, clock),
        clock=clock,
        owner="gw-a",
    )
    p.prepare()
    return p


def reconciler_of(
    store: Store,
    pipeline: CallPipeline,
    clock: Clock,
    owner: str,
    policy: ReconcilePolicy | None = None,
) -> Reconciler:
    return Reconciler(
        store=store,
        registry=pipeline._registry,  # the same registry the pipeline dispatches through
        dispatcher=dispatcher_of(store, pipeline._registry, clock),
        redactor=Redactor(b"salt"),
        owner=owner,
        clock=clock,
        policy=policy or ReconcilePolicy(),
    )


def workers_of(store: Store, reconciler: Reconciler, clock: Clock) -> Workers:
    return Workers(store=store, agenda=store, reconciler=reconciler, clock=clock, pruning=store)


@pytest.fixture
def workers(store: Store, pipeline: CallPipeline, clock: Clock) -> Workers:
    policy = ReconcilePolicy(max_attempts=2, backoff_s=10)
    return workers_of(store, reconciler_of(store, pipeline, clock, "gw-b", policy), clock)


async def unknown_call(pipeline: CallPipeline, executor: FakeExecutor, tool: str = "refund_order") -> str:
    executor.then(unknown())
    report = await pipeline.call(CallInput(ALICE, tool, {"order_id": "1001"}, idempotency_key=f"k-{tool}"))
    assert report.call.status == "result_unknown"
    return report.call.tool_call_id


async def test_a_found_effect_completes_the_unknown_call_with_the_found_result(
    pipeline: CallPipeline, executor: FakeExecutor, workers: Workers, store: Store
) -> None:
    tool_call_id = await unknown_call(pipeline, executor)
    executor.reconcile_script.append(ReconcileResult("succeeded", json_result({"refund_id": "r1"})))

    await workers.tick()

    call = store.get_call(tool_call_id)
    assert (call.status, call.verification_status) == ("completed", "confirmed_success")
    assert call.result["structuredContent"] == {"refund_id": "r1"}
    assert len(executor.invocations) == 1  # looked up, never re-sent
    assert [e.type for e in store.events(tool_call_id=tool_call_id)][-2:] == [
        "reconciliation.started",
        "reconciliation.resolved",
    ]


async def test_a_record_naming_another_dispatch_is_not_the_unknown_calls_effect(
    pipeline: CallPipeline, executor: FakeExecutor, workers: Workers, store: Store, clock: Clock
) -> None:
    # Another agent's refund under the same key (keys are each principal's own here, not at the
    # backend): settling the call `completed` with it would report a refund that never happened.
    tool_call_id = await unknown_call(pipeline, executor)
    someone_elses = new_id("req")
    clock.advance(HORIZON_END_S)
    executor.reconcile_script.append(refund_record(someone_elses))

    await workers.tick()

    call = store.get_call(tool_call_id)
    assert (call.status, call.verification_status) == ("failed", "confirmed_failure")
    evidence = store.events(tool_call_id=tool_call_id)[-1].payload["evidence"]
    assert (evidence["verdict"], evidence["records_of_others"]) == ("not_found", 1)
    assert someone_elses not in json.dumps(store.events(tool_call_id=tool_call_id)[-1].payload)
    # A record naming this call, or naming no dispatch at all (a backend that keeps no request id),
    # is still its effect.
    for key, record in (("named", refund_record), ("unnamed", lambda _: refund_record(None))):
        executor.then(unknown())
        refund = CallInput(ALICE, "refund_order", {"order_id": "1001"}, idempotency_key=key)
        report = await pipeline.call(refund)
        executor.reconcile_script.append(record(report.call.external_request_id))
        await workers.tick()
        assert store.get_call(report.call.tool_call_id).status == "completed"


async def test_no_effect_found_before_the_commit_horizon_is_inconclusive_and_keeps_the_key_claimed(
    pipeline: CallPipeline, executor: FakeExecutor, workers: Workers, store: Store, clock: Clock
) -> None:
    tool_call_id = await unknown_call(pipeline, executor)
    sent_at = clock()
    executor.reconcile_script.extend([ReconcileResult("not_found", evidence={"records": 0})] * 3)

    await workers.tick()

    call = store.get_call(tool_call_id)
    assert (call.status, call.verification_status) == ("result_unknown", "pending")
    assert "never answered" in status_document(call)["next"]
    last = store.events(tool_call_id=tool_call_id)[-1]
    assert last.type == "reconciliation.inconclusive"
    assert last.payload["evidence"] == {
        "records": 0,
        "verdict": "not_found",
        "reason": "before_commit_horizon",
        "sent_at": format_ts(sent_at),
        "horizon_at": format_ts(sent_at + timedelta(seconds=HORIZON_END_S)),
        "looked_up_at": format_ts(sent_at),
    }
    # The identical call (same key) joins the unsettled one: it is never dispatched again.
    again = await pipeline.call(
        CallInput(ALICE, "refund_order", {"order_id": "1001"}, idempotency_key="k-refund_order")
    )
    assert (again.call.tool_call_id, again.call.status) == (tool_call_id, "result_unknown")
    assert len(executor.invocations) == 1
    # Past max_attempts (2) of not-found lookups, still no escalation before the horizon.
    clock.advance(10)
    await workers.tick()
    clock.advance(20)
    await workers.tick()
    assert len(executor.reconciled) == 3
    call = store.get_call(tool_call_id)
    assert (call.status, call.verification_status) == ("result_unknown", "pending")


async def test_the_dispatch_carries_the_commit_deadline_the_reconciler_counts_the_horizon_to(
    pipeline: CallPipeline, executor: FakeExecutor, store: Store
) -> None:
    tool_call_id = await unknown_call(pipeline, executor)

    sent_at = store.dispatched_at(tool_call_id)
    assert sent_at is not None
    assert executor.invocations[0].commit_deadline == sent_at + timedelta(seconds=HORIZON_END_S)


async def test_the_next_lookup_is_due_no_later_than_the_commit_horizon(
    pipeline: CallPipeline, executor: FakeExecutor, workers: Workers, store: Store, clock: Clock
) -> None:
    tool_call_id = await unknown_call(pipeline, executor)
    sent_at = clock()
    clock.advance(HORIZON_END_S - 1)  # a backoff of 10 s would pass the horizon
    executor.reconcile_script.append(ReconcileResult("not_found"))

    await workers.tick()

    assert store.get_call(tool_call_id).next_reconcile_at == sent_at + timedelta(seconds=HORIZON_END_S)


async def test_no_effect_found_after_the_commit_horizon_fails_the_call_with_the_times_as_evidence(
    pipeline: CallPipeline, executor: FakeExecutor, workers: Workers, store: Store, clock: Clock
) -> None:
    tool_call_id = await unknown_call(pipeline, executor)
    sent_at = clock()
    # `HORIZON_S` after the record is not yet the horizon: the dispatcher may have sent up to the lease
    # margin later (a pause between recording and sending), and the backend may act for HORIZON_S after.
    clock.advance(HORIZON_S)
    executor.reconcile_script.append(ReconcileResult("not_found", evidence={"records": 0}))
    await workers.tick()
    assert store.get_call(tool_call_id).status == "result_unknown"
    clock.advance(LEASE_MARGIN_S)
    executor.reconcile_script.append(ReconcileResult("not_found", evidence={"records": 0}))

    await workers.tick()

    call = store.get_call(tool_call_id)
    assert (call.status, call.verification_status) == ("failed", "confirmed_failure")
    # Told as established by lookup after the horizon, never as an error the backend answered.
    told = shape_call(call)
    assert told["structuredContent"]["next"] == FAILED_BY["no_effect_after_horizon"]
    assert (
        "not known when it was made" in told["content"][0]["text"] and "horizon" in told["content"][0]["text"]
    )
    assert "answered with an error" not in json.dumps(told)
    evidence = store.events(tool_call_id=tool_call_id)[-1].payload["evidence"]
    assert evidence == {
        "records": 0,
        "verdict": "not_found",
        "sent_at": format_ts(sent_at),
        "horizon_at": format_ts(sent_at + timedelta(seconds=HORIZON_END_S)),
        "looked_up_at": format_ts(clock()),
    }


async def test_a_failure_the_backend_reports_settles_the_call_before_the_horizon(
    pipeline: CallPipeline, executor: FakeExecutor, workers: Workers, store: Store
) -> None:
    failed_id = await unknown_call(pipeline, executor)
    executor.reconcile_script.append(ReconcileResult("failed", evidence={"state": "declined"}))

    await workers.tick()

    call = store.get_call(failed_id)
    assert (call.status, call.verification_status) == ("failed", "confirmed_failure")
    assert status_document(call)["next"] == FAILED_BY["backend_reported_failure"]
    assert store.events(tool_call_id=failed_id)[-1].payload["evidence"] == {
        "state": "declined",
        "verdict": "failed",
    }


def a_person_settles_while_we_look(
    executor: FakeExecutor,
    store: Store,
    clock: Clock,
    tool_call_id: str,
    *,
    succeeded: bool,
    answer: ReconcileResult,
) -> None:
    """The executor's next lookup answers `answer`, after a person settled the call while it looked."""

    async def lookup(invocation: Invocation) -> ReconcileResult:
        evidence = "refund seen" if succeeded else "no refund"
        store.resolve_manually(
            ResolveManually(tool_call_id, succeeded=succeeded, evidence=evidence, by="carol", now=clock())
        )
        return answer

    executor.reconcile = lookup  # type: ignore[method-assign]


DECLINED = ReconcileResult(
    "failed",
    evidence={
        "records": 1,
        "field": "/status",
        "state": "declined",
        "record": {"id": "r1", "status": "declined"},
    },
)


async def test_a_failure_the_backend_reports_is_final_and_never_looked_up_again(
    pipeline: CallPipeline, executor: FakeExecutor, workers: Workers, store: Store, clock: Clock
) -> None:
    tool_call_id = await unknown_call(pipeline, executor)
    executor.reconcile_script.append(DECLINED)

    await workers.tick()

    call = store.get_call(tool_call_id)
    assert (call.status, call.verification_status, call.error) == (
        "failed",
        "confirmed_failure",
        "backend_reported_failure",
    )
    assert call.next_reconcile_at is None  # the backend's own record, not an absence: no re-checks
    resolved = store.events(tool_call_id=tool_call_id)[-1]
    assert resolved.payload["evidence"]["record"] == {"id": "r1", "status": "declined"}
    assert resolved.payload["detail"] == "the backend reports the effect failed"
    told = shape_call(call)
    assert (told["isError"], told["structuredContent"]["error"]) == (True, "backend_reported_failure")
    assert told["structuredContent"]["next"] == FAILED_BY["backend_reported_failure"]
    clock.advance(100 * HORIZON_S)
    await workers.tick()
    assert len(executor.reconciled) == 1
    assert store.verify().ok


async def test_a_failure_the_backend_reports_after_a_person_settled_it_succeeded_is_a_contradiction(
    pipeline: CallPipeline, executor: FakeExecutor, workers: Workers, store: Store, clock: Clock
) -> None:
    tool_call_id = await unknown_call(pipeline, executor)
    a_person_settles_while_we_look(executor, store, clock, tool_call_id, succeeded=True, answer=DECLINED)

    await workers.tick()

    call = store.get_call(tool_call_id)
    assert (call.status, call.verification_status, call.contradicted) == ("completed", "inconclusive", True)
    event = store.events(tool_call_id=tool_call_id)[-1]
    assert (event.type, event.payload["source"], event.payload["verdict"]) == (
        "reconciliation.contradicted",
        "lookup",
        "confirmed_failure",
    )
    assert event.payload["evidence"]["state"] == "declined"
    assert store.verify().ok


async def test_inconclusive_lookups_back_off_then_escalate_to_a_human(
    pipeline: CallPipeline, executor: FakeExecutor, workers: Workers, store: Store, clock: Clock
) -> None:
    tool_call_id = await unknown_call(pipeline, executor)
    executor.reconcile_script.extend([ReconcileResult("inconclusive"), ReconcileResult("inconclusive")])

    await workers.tick()
    await workers.tick()  # still backing off: no second lookup yet
    assert len(executor.reconciled) == 1
    clock.advance(10)
    await workers.tick()

    call = store.get_call(tool_call_id)
    assert call.escalated and len(executor.reconciled) == 2
    assert store.events(tool_call_id=tool_call_id)[-1].type == "reconciliation.escalated"


async def escalated_call(
    pipeline: CallPipeline, executor: FakeExecutor, workers: Workers, clock: Clock
) -> str:
    """A refund left unknown, whose two lookups were inconclusive: handed to a person, well before
    its commit horizon ends."""
    tool_call_id = await unknown_call(pipeline, executor)
    executor.reconcile_script.extend([ReconcileResult("inconclusive"), ReconcileResult("inconclusive")])
    await workers.tick()
    clock.advance(10)
    await workers.tick()
    return tool_call_id


def resolved_failed_by_carol(store: Store, clock: Clock, tool_call_id: str) -> None:
    store.resolve_manually(
        ResolveManually(
            tool_call_id, succeeded=False, evidence="no refund in the ledger", by="carol", now=clock()
        )
    )


async def test_an_escalated_call_tells_the_model_a_person_is_checking(
    pipeline: CallPipeline, executor: FakeExecutor, workers: Workers, store: Store, clock: Clock
) -> None:
    call = store.get_call(await escalated_call(pipeline, executor, workers, clock))

    told = shape_call(call)["structuredContent"]
    assert (told["reconciliation"], told["next"]) == ("escalated", ESCALATED)
    assert "Writ looks the outcome up" not in told["next"]


async def test_a_failure_a_person_records_is_looked_up_again_and_a_late_effect_contradicts_it(
    pipeline: CallPipeline, executor: FakeExecutor, workers: Workers, store: Store, clock: Clock
) -> None:
    # The person says "failed" before the horizon ends; the backend commits the refund afterwards.
    tool_call_id = await escalated_call(pipeline, executor, workers, clock)
    horizon_at = store.dispatched_at(tool_call_id) + timedelta(seconds=HORIZON_END_S)
    assert clock() < horizon_at
    resolved_failed_by_carol(store, clock, tool_call_id)

    call = store.get_call(tool_call_id)
    assert (call.status, call.resolved_by, call.next_reconcile_at) == ("failed", "carol", clock())
    assert store.events(tool_call_id=tool_call_id)[-1].payload["recheck_at"] == format_ts(clock())
    # Looked up at once: nothing yet. Looked up again when the horizon ends (nothing yet either), then
    # on the schedule after it.
    executor.reconcile_script.append(NOT_FOUND)
    await workers.tick()
    assert store.get_call(tool_call_id).next_reconcile_at == horizon_at
    clock.now = horizon_at
    executor.reconcile_script.append(NOT_FOUND)
    await workers.tick()
    first_recheck = horizon_at + timedelta(seconds=HORIZON_S)
    assert store.get_call(tool_call_id).next_reconcile_at == first_recheck
    clock.now = first_recheck
    executor.reconcile_script.append(refund_record(store.get_call(tool_call_id).external_request_id))
    await workers.tick()

    call = store.get_call(tool_call_id)
    assert (call.status, call.contradicted, len(executor.reconciled)) == ("failed", True, 5)
    event = store.events(tool_call_id=tool_call_id)[-1]
    assert (event.type, event.payload["detail"]) == (
        "reconciliation.contradicted",
        "a re-check found the effect of this call, which carol settled failed by hand",
    )
    assert event.payload["settled_evidence"]["manual"] == "no refund in the ledger"
    assert store.verify().ok


async def test_a_failure_a_person_records_long_after_the_horizon_is_looked_up_again_after_it(
    pipeline: CallPipeline, executor: FakeExecutor, workers: Workers, store: Store, clock: Clock
) -> None:
    # The person settles the escalated call a day later, while the backend still cannot answer: the look
    # at once tells nothing, and the backend, back later, has the refund after all.
    tool_call_id = await escalated_call(pipeline, executor, workers, clock)
    clock.advance(86_400)
    resolved_failed_by_carol(store, clock, tool_call_id)
    resolved_at = clock()
    executor.reconcile_script.append(ReconcileResult("inconclusive", evidence={"error": "TimeoutError"}))
    await workers.tick()

    # Counted from her verdict, not from the horizon that ended a day before it.
    assert store.get_call(tool_call_id).next_reconcile_at == resolved_at + timedelta(seconds=HORIZON_S)
    clock.now = resolved_at + timedelta(seconds=HORIZON_S)
    executor.reconcile_script.append(refund_record(store.get_call(tool_call_id).external_request_id))
    await workers.tick()

    call = store.get_call(tool_call_id)
    assert (call.status, call.contradicted) == ("failed", True)
    assert store.events(tool_call_id=tool_call_id)[-1].type == "reconciliation.contradicted"
    assert store.verify().ok


async def test_one_calls_failing_lookup_does_not_keep_the_calls_due_after_it_from_being_settled(
    pipeline: CallPipeline, executor: FakeExecutor, workers: Workers, store: Store
) -> None:
    first = await unknown_call(pipeline, executor)
    second = await unknown_call(pipeline, executor, "slow_refund")
    found = ReconcileResult("succeeded", json_result({"refund_id": "r1"}), evidence={"records": 1})
    answers = {first: RuntimeError("a reader that did not foresee this answer")}

    async def lookup(invocation: Invocation) -> ReconcileResult:
        executor.reconciled.append(invocation)
        answer = answers.get(invocation.tool_call_id, found)
        if isinstance(answer, Exception):
            raise answer
        return answer

    executor.reconcile = lookup  # type: ignore[method-assign]

    await workers.tick()

    assert {i.tool_call_id for i in executor.reconciled} == {first, second}
    assert store.get_call(second).status == "completed"
    assert store.get_call(first).status == "result_unknown"  # tried again on a later pass


async def test_a_failure_a_person_records_on_a_call_never_looked_up_is_not_looked_up(
    pipeline: CallPipeline, executor: FakeExecutor, workers: Workers, store: Store, clock: Clock
) -> None:
    tool_call_id = await unknown_call(pipeline, executor, "send_fax")
    await workers.tick()
    resolved_failed_by_carol(store, clock, tool_call_id)

    assert store.get_call(tool_call_id).next_reconcile_at is None
    assert store.events(tool_call_id=tool_call_id)[-1].payload["recheck_at"] is None
    clock.advance(100 * HORIZON_S)
    await workers.tick()
    assert executor.reconciled == []


async def test_a_capability_without_a_lookup_is_escalated_at_once(
    pipeline: CallPipeline, executor: FakeExecutor, workers: Workers, store: Store
) -> None:
    tool_call_id = await unknown_call(pipeline, executor, "send_fax")

    await workers.tick()

    assert store.get_call(tool_call_id).escalated
    assert len(executor.invocations) == 1


async def test_a_deduplicating_backend_gets_the_same_key_again_as_a_recorded_retry(
    pipeline: CallPipeline, executor: FakeExecutor, workers: Workers, store: Store
) -> None:
    tool_call_id = await unknown_call(pipeline, executor, "pay_invoice")

    await workers.tick()

    call = store.get_call(tool_call_id)
    assert (call.status, call.attempts) == ("completed", 2)
    sent = scoped_key("acme", "alice", "k-pay_invoice")
    assert [inv.idempotency_key for inv in executor.invocations] == [sent, sent]
    assert executor.invocations[1].attempt == 2


REFUSED_RESENDS = {
    "409 in progress": failed("http_409", "payments answered 409: a request with this key is in progress"),
    "4xx": failed("http_400", "payments answered 400: invalid request"),
    "5xx": unknown("http_503", "payments answered 503: unavailable"),
    "timeout": unknown("response_timeout", "no answer within 0.2s"),
    "MCP isError, errors before effect": failed("tool_error", "Error executing tool pay_invoice"),
    "MCP isError": unknown("tool_error", "Error executing tool pay_invoice"),
    "MCP JSON-RPC error": failed("mcp_error_32602", "Invalid params"),
}


@pytest.mark.parametrize("answer", REFUSED_RESENDS.values(), ids=REFUSED_RESENDS.keys())
async def test_a_re_send_answered_with_no_success_leaves_the_call_unknown_then_backs_off_and_escalates(
    pipeline: CallPipeline,
    executor: FakeExecutor,
    workers: Workers,
    store: Store,
    clock: Clock,
    answer: Outcome,
) -> None:
    # A refusal of attempt 2 says nothing of attempt 1, which may have committed (or still be running:
    # Stripe answers 409 to the same key while the first request is in flight, then commits it).
    tool_call_id = await unknown_call(pipeline, executor, "pay_invoice")
    executor.then(answer)

    await workers.tick()

    call = store.get_call(tool_call_id)
    assert (call.status, call.verification_status, call.attempts) == ("result_unknown", "pending", 2)
    assert call.error == answer.error and not call.escalated
    events = store.events(tool_call_id=tool_call_id)
    assert [e.type for e in events][-4:] == [
        "reconciliation.started",
        "tool_call.dispatching",
        "tool_call.result_unknown",
        "reconciliation.inconclusive",
    ]
    said = events[-2].payload
    assert (said["error"], said["detail"]) == (answer.error, answer.detail)
    if answer.kind == "failed":  # the refusal itself is kept as evidence
        assert said["evidence"]["resend_attempt"] == 2
        assert said["evidence"]["answer"]["content"] == [{"type": "text", "text": answer.detail}]
    assert events[-1].payload["next_attempt_at"] == format_ts(clock.now + timedelta(seconds=10))
    await workers.tick()  # backing off: nothing sent, nothing settled
    assert len(executor.invocations) == 2

    clock.advance(10)
    await workers.tick()  # no re-send left (max_attempts 2) and no lookup: a person settles it

    call = store.get_call(tool_call_id)
    assert (call.status, call.escalated, len(executor.invocations)) == ("result_unknown", True, 2)
    escalated = store.events(tool_call_id=tool_call_id)[-1]
    assert escalated.type == "reconciliation.escalated"
    assert escalated.payload["reason"] == "inconclusive_after_retries"
    assert escalated.payload["detail"] == (
        f"sent 2 times under the same key and no answer was a success (the last: {answer.error}); "
        "pay-invoice offers no lookup"
    )
    assert store.verify().ok


async def test_a_re_send_refused_while_the_first_runs_completes_once_a_later_re_send_gets_the_effect(
    pipeline: CallPipeline, executor: FakeExecutor, store: Store, clock: Clock
) -> None:
    policy = ReconcilePolicy(max_attempts=4, backoff_s=10)
    workers = workers_of(store, reconciler_of(store, pipeline, clock, "gw-b", policy), clock)
    tool_call_id = await unknown_call(pipeline, executor, "pay_invoice")
    in_progress = failed("http_409", "a request with this key is in progress")
    executor.then(in_progress, in_progress, completed({"invoice": "paid", "request": "the first"}))

    await workers.tick()
    clock.advance(10)
    await workers.tick()
    assert store.get_call(tool_call_id).status == "result_unknown"
    clock.advance(20)  # the backoff doubles
    await workers.tick()

    call = store.get_call(tool_call_id)
    assert (call.status, call.attempts) == ("completed", 4)
    assert call.result["structuredContent"] == {"invoice": "paid", "request": "the first"}
    sent = {inv.idempotency_key for inv in executor.invocations}
    assert sent == {scoped_key("acme", "alice", "k-pay_invoice")}
    assert store.verify().ok


async def test_a_dispatch_left_past_its_lease_is_recovered_as_unknown_and_then_reconciled(
    pipeline: CallPipeline, executor: FakeExecutor, workers: Workers, store: Store, clock: Clock
) -> None:
    tool_call_id = await unknown_call(pipeline, executor)
    # Make it look like the dispatcher died mid-dispatch: a second call stays dispatching.
    from tests.store.builders import call_request

    store.admit(call_request(tool_call_id="tc-dead", idempotency_key="dead", now=clock(), lease_s=1))
    executor.reconcile_script.extend(
        [ReconcileResult("not_found"), ReconcileResult("succeeded", json_result({"ok": 1}))]
    )
    clock.advance(HORIZON_END_S)  # past both horizons: a lookup's "not found" settles

    recovered, reconciled = await workers.tick()

    assert recovered == 1 and reconciled == 2
    assert store.get_call("tc-dead").status in ("completed", "failed")
    assert store.get_call(tool_call_id).status in ("completed", "failed")
    assert next(e for e in store.events(tool_call_id="tc-dead") if e.type == "tool_call.result_unknown")


async def test_a_worker_paused_past_its_lease_does_not_dispatch(
    pipeline: CallPipeline, executor: FakeExecutor, store: Store, clock: Clock
) -> None:
    def pause_then_answer(invocation):  # never reached: the lease check comes first
        raise AssertionError("dispatched after the lease ran out")

    dispatcher = pipeline._dispatcher  # the pause is simulated right at the local lease check
    original = dispatcher._lease_covers_dispatch
    dispatcher._lease_covers_dispatch = lambda cap, call: (clock.advance(60), original(cap, call))[1]
    executor.then(pause_then_answer)

    report = await pipeline.call(CallInput(ALICE, "refund_order", {"order_id": "1"}, idempotency_key="p"))

    assert executor.invocations == []
    assert (report.call.status, report.call.error) == ("failed", "lease_expired_before_dispatch")


async def test_a_lookup_finding_the_effect_after_a_person_settled_it_failed_is_recorded_as_a_contradiction(
    pipeline: CallPipeline, executor: FakeExecutor, workers: Workers, store: Store, clock: Clock
) -> None:
    tool_call_id = await unknown_call(pipeline, executor)
    found = ReconcileResult("succeeded", json_result({"refund_id": "r1"}), evidence={"records": 1})
    a_person_settles_while_we_look(executor, store, clock, tool_call_id, succeeded=False, answer=found)

    await workers.tick()

    call = store.get_call(tool_call_id)
    assert (call.status, call.verification_status, call.contradicted) == ("failed", "inconclusive", True)
    told = shape_call(call)
    assert told["isError"] is False
    assert told["structuredContent"]["reconciliation"] == "contradicted"
    assert told["structuredContent"]["next"] == CONTRADICTED
    event = store.events(tool_call_id=tool_call_id)[-1]
    assert (event.type, event.payload["source"], event.payload["verdict"]) == (
        "reconciliation.contradicted",
        "lookup",
        "confirmed_success",
    )
    assert event.payload["settled_evidence"]["manual"] == "no refund"
    assert event.payload["evidence"]["records"] == 1


async def test_a_success_answered_after_the_call_was_settled_failed_is_recorded_as_a_contradiction(
    pipeline: CallPipeline, executor: FakeExecutor, workers: Workers, store: Store, clock: Clock
) -> None:
    executor.gate = anyio.Event()
    async with anyio.create_task_group() as tg:
        reports: list[CallReport] = []

        async def call() -> None:
            reports.append(await pipeline.call(CallInput(ALICE, "slow_refund", {"order_id": "7"})))

        tg.start_soon(call)
        await eventually(lambda: executor.invocations, within_s=10)
        # The dispatcher is paused past its lease and the horizon: recovered, looked up, not found.
        clock.advance(HORIZON_S + 40)
        executor.reconcile_script.append(ReconcileResult("not_found"))
        await workers.tick()
        tool_call_id = executor.invocations[0].tool_call_id
        assert store.get_call(tool_call_id).status == "failed"
        executor.gate.set()  # and then the backend's answer arrives: it did refund

    call = store.get_call(tool_call_id)
    assert (call.status, call.verification_status) == ("failed", "inconclusive")
    assert reports[0].call.contradicted
    event = store.events(tool_call_id=tool_call_id)[-1]
    assert (event.type, event.payload["source"]) == ("reconciliation.contradicted", "late_response")
    assert event.payload["settled_evidence"]["verdict"] == "not_found"
    assert event.payload["evidence"]["result"]["structuredContent"] == {"refund_id": "r1"}


async def test_a_failure_the_backend_answered_is_told_as_its_answer(
    pipeline: CallPipeline, executor: FakeExecutor
) -> None:
    executor.then(failed("card_declined"))

    report = await pipeline.call(CallInput(ALICE, "refund_order", {"order_id": "9"}))

    told = shape_call(report.call)
    assert told["structuredContent"]["next"] == NEXT["failed"]
    assert told["content"] == [{"type": "text", "text": "rejected"}]  # the backend's own answer


async def test_a_workers_pass_prunes_the_budget_counters_and_loop_marks_of_ended_windows(
    store: Store, workers: Workers, clock: Clock
) -> None:
    ended = clock() - timedelta(days=2)
    charge = Charge("calls", "old-counter", 1, 10, ended, ended + timedelta(hours=1), "principal")
    mark = LoopKey("same", "repeated_action", "old-pattern", 5, 3600, ended, ended + timedelta(hours=1))
    store.admit(
        call_request(tool_call_id="tc-old", idempotency_key="k-old", charges=(charge,), loops=(mark,))
    )

    await workers.tick()

    with store.engine.connect() as conn:
        assert conn.execute(select(budget_counters.c.counter_key)).all() == []
        assert conn.execute(select(loop_marks.c.pattern_key)).all() == []
    assert store.verify().ok


NOT_FOUND = ReconcileResult("not_found", evidence={"records": 0})


async def failed_after_horizon(
    pipeline: CallPipeline, executor: FakeExecutor, workers: Workers, store: Store, clock: Clock
) -> str:
    """A keyless refund (as a model sends it) left unknown, then settled failed: not found after its
    horizon. Its key is derived, so the identical call sent again later is a new call under it."""
    executor.then(unknown())
    report = await pipeline.call(CallInput(ALICE, "refund_order", {"order_id": "1001"}))
    tool_call_id = report.call.tool_call_id
    clock.advance(HORIZON_END_S)
    executor.reconcile_script.append(NOT_FOUND)
    await workers.tick()
    assert store.get_call(tool_call_id).status == "failed"
    return tool_call_id


def refund_record(request_id: str | None) -> ReconcileResult:
    record = {"refund_id": "r1", **({"request_id": request_id} if request_id else {})}
    return ReconcileResult("succeeded", json_result(record), evidence={"records": 1})


async def test_a_failure_after_the_horizon_is_rechecked_on_schedule_and_then_no_more(
    pipeline: CallPipeline, executor: FakeExecutor, workers: Workers, store: Store, clock: Clock
) -> None:
    tool_call_id = await failed_after_horizon(pipeline, executor, workers, store, clock)
    horizon_at = store.dispatched_at(tool_call_id) + timedelta(seconds=HORIZON_END_S)
    # The default schedule: 1, 3 and 10 horizons after the horizon ended.
    schedule = [horizon_at + timedelta(seconds=n * HORIZON_S) for n in (1, 3, 10)]
    assert store.get_call(tool_call_id).next_reconcile_at == schedule[0]
    assert store.events(tool_call_id=tool_call_id)[-1].payload["recheck_at"] == format_ts(schedule[0])

    for at, following in zip(schedule, [*schedule[1:], None], strict=True):
        clock.now = at - timedelta(seconds=1)
        await workers.tick()  # not due yet: no lookup
        lookups = len(executor.reconciled)
        clock.now = at
        executor.reconcile_script.append(NOT_FOUND)
        await workers.tick()
        assert len(executor.reconciled) == lookups + 1
        call = store.get_call(tool_call_id)
        assert (call.status, call.verification_status, call.next_reconcile_at) == (
            "failed",
            "confirmed_failure",
            following,
        )
    clock.advance(100 * HORIZON_S)
    await workers.tick()
    assert len(executor.reconciled) == 4  # the verdict's lookup and three re-checks
    last = store.events(tool_call_id=tool_call_id)[-1]
    assert (last.type, last.payload["next_recheck_at"], last.payload["evidence"]["verdict"]) == (
        "reconciliation.rechecked",
        None,
        "not_found",
    )
    assert store.verify().ok


async def test_a_recheck_that_finds_the_calls_own_effect_records_a_contradiction(
    pipeline: CallPipeline, executor: FakeExecutor, workers: Workers, store: Store, clock: Clock
) -> None:
    tool_call_id = await failed_after_horizon(pipeline, executor, workers, store, clock)
    ours = store.get_call(tool_call_id).external_request_id
    # The backend broke its horizon: the refund landed after it, under this call's request id.
    clock.now = store.get_call(tool_call_id).next_reconcile_at
    executor.reconcile_script.append(refund_record(ours))

    await workers.tick()

    call = store.get_call(tool_call_id)
    assert (call.status, call.verification_status, call.contradicted) == ("failed", "inconclusive", True)
    assert (call.next_reconcile_at, call.lease_owner) == (None, None)
    told = shape_call(call)
    assert (told["structuredContent"]["reconciliation"], told["structuredContent"]["next"]) == (
        "contradicted",
        CONTRADICTED,
    )
    event = store.events(tool_call_id=tool_call_id)[-1]
    assert (event.type, event.payload["source"], event.payload["verdict"]) == (
        "reconciliation.contradicted",
        "lookup",
        "confirmed_success",
    )
    assert event.payload["settled_evidence"]["verdict"] == "not_found"
    assert event.payload["evidence"]["result"]["structuredContent"] == {"refund_id": "r1", "request_id": ours}
    # The identical call now joins the contradicted one instead of refunding again.
    again = await pipeline.call(CallInput(ALICE, "refund_order", {"order_id": "1001"}))
    assert again.call.tool_call_id == tool_call_id and len(executor.invocations) == 1
    clock.advance(100 * HORIZON_S)
    await workers.tick()
    assert len(executor.reconciled) == 2  # no more re-checks
    assert store.verify().ok


async def test_an_effect_found_under_the_key_with_no_later_call_sent_is_the_calls_own(
    pipeline: CallPipeline, executor: FakeExecutor, workers: Workers, store: Store, clock: Clock
) -> None:
    tool_call_id = await failed_after_horizon(pipeline, executor, workers, store, clock)
    clock.now = store.get_call(tool_call_id).next_reconcile_at
    executor.reconcile_script.append(refund_record(None))  # a backend that keeps no request id

    await workers.tick()

    assert store.get_call(tool_call_id).contradicted


async def test_a_recheck_that_finds_the_re_sends_own_effect_records_no_contradiction(
    pipeline: CallPipeline, executor: FakeExecutor, workers: Workers, store: Store, clock: Clock
) -> None:
    tool_call_id = await failed_after_horizon(pipeline, executor, workers, store, clock)
    # The model sends the identical refund again: a new call under the freed key, which lands.
    resent = await pipeline.call(CallInput(ALICE, "refund_order", {"order_id": "1001"}))
    assert resent.call.tool_call_id != tool_call_id and resent.call.status == "completed"
    assert resent.call.idempotency_key == store.get_call(tool_call_id).idempotency_key
    clock.now = store.get_call(tool_call_id).next_reconcile_at
    executor.reconcile_script.extend([refund_record(resent.call.external_request_id), refund_record(None)])

    await workers.tick()

    call = store.get_call(tool_call_id)
    assert (call.status, call.verification_status, call.contradicted) == (
        "failed",
        "confirmed_failure",
        False,
    )
    event = store.events(tool_call_id=tool_call_id)[-1]
    assert event.type == "reconciliation.rechecked"
    # The re-send's record names the re-send: no record of this call's at all.
    assert (event.payload["evidence"]["verdict"], event.payload["evidence"]["records_of_others"]) == (
        "not_found",
        1,
    )
    assert call.next_reconcile_at is not None  # still re-checked, in case its own lands later
    # A record naming neither call, once another was sent under the key, is not taken for this one's.
    clock.now = call.next_reconcile_at
    await workers.tick()
    unattributed = store.events(tool_call_id=tool_call_id)[-1].payload["evidence"]
    assert (unattributed["effect_of"], unattributed["key_held_by"]) == (None, resent.call.tool_call_id)
    assert not store.get_call(tool_call_id).contradicted
    assert store.verify().ok


async def test_a_recheck_that_finds_another_principals_effect_under_the_key_records_no_contradiction(
    pipeline: CallPipeline, executor: FakeExecutor, workers: Workers, store: Store, clock: Clock
) -> None:
    # Anyone who guesses a key could otherwise flood approvers with contradictions planted in other
    # principals' failed calls.
    tool_call_id = await failed_after_horizon(pipeline, executor, workers, store, clock)
    clock.now = store.get_call(tool_call_id).next_reconcile_at
    executor.reconcile_script.append(refund_record(new_id("req")))

    await workers.tick()

    call = store.get_call(tool_call_id)
    assert (call.status, call.verification_status) == ("failed", "confirmed_failure")
    assert not call.contradicted
    evidence = store.events(tool_call_id=tool_call_id)[-1].payload["evidence"]
    assert (evidence["verdict"], evidence["records_of_others"]) == ("not_found", 1)
    assert store.verify().ok


async def test_a_recheck_that_finds_the_backends_failure_record_agrees_with_the_failure(
    pipeline: CallPipeline, executor: FakeExecutor, workers: Workers, store: Store, clock: Clock
) -> None:
    tool_call_id = await failed_after_horizon(pipeline, executor, workers, store, clock)
    clock.now = store.get_call(tool_call_id).next_reconcile_at
    executor.reconcile_script.append(DECLINED)

    await workers.tick()

    call = store.get_call(tool_call_id)
    assert (call.status, call.verification_status, call.contradicted) == (
        "failed",
        "confirmed_failure",
        False,
    )
    assert call.error == "no_effect_after_horizon"  # how it was settled stays what it was
    event = store.events(tool_call_id=tool_call_id)[-1]
    assert (event.type, event.payload["evidence"]["verdict"]) == ("reconciliation.rechecked", "failed")
    assert event.payload["next_recheck_at"] is not None
    assert store.verify().ok


async def test_two_reconcilers_recheck_a_failure_once_between_them(
    pipeline: CallPipeline, executor: FakeExecutor, workers: Workers, store: Store, clock: Clock
) -> None:
    tool_call_id = await failed_after_horizon(pipeline, executor, workers, store, clock)
    clock.now = store.get_call(tool_call_id).next_reconcile_at
    due = store.due_reconciliations(now=clock())
    other = reconciler_of(store, pipeline, clock, "gw-c")
    executor.reconcile_script.append(NOT_FOUND)

    assert await other.settle(due[0]) is True
    assert await other.settle(due[0]) is False  # the same view again: its lease is taken

    assert len(executor.reconciled) == 2


async def test_an_unknown_call_sent_before_keys_were_scoped_is_looked_up_under_its_plain_key(
    pipeline: CallPipeline, executor: FakeExecutor, workers: Workers, store: Store
) -> None:
    # An upgrade: the call was sent by a Writ that gave the backend the client's key as it came; the
    # backend knows its effect by that key, and by no other.
    old = await unknown_call(pipeline, executor, "refund_order")
    tamper.as_dispatched_before_keys_were_scoped(store, old)
    new = await unknown_call(pipeline, executor, "slow_refund")
    for _ in range(2):
        executor.reconcile_script.append(ReconcileResult("succeeded", json_result({"refund_id": "r1"})))

    await workers.tick()

    looked_up = {inv.tool_call_id: inv.idempotency_key for inv in executor.reconciled}
    assert looked_up == {old: "k-refund_order", new: scoped_key("acme", "alice", "k-slow_refund")}
    assert store.get_call(old).status == store.get_call(new).status == "completed"
    assert store.verify().ok  # a log with both kinds of dispatch replays to the same projections


async def test_an_unknown_call_sent_before_keys_were_scoped_is_re_sent_under_its_plain_key(
    pipeline: CallPipeline, executor: FakeExecutor, workers: Workers, store: Store
) -> None:
    tool_call_id = await unknown_call(pipeline, executor, "pay_invoice")
    tamper.as_dispatched_before_keys_were_scoped(store, tool_call_id)

    await workers.tick()

    call = store.get_call(tool_call_id)
    assert (call.status, call.attempts, call.key_scoped) == ("completed", 2, False)
    # A deduplicating backend answers the re-send with the first effect only under the key it got.
    assert executor.invocations[-1].idempotency_key == "k-pay_invoice"
    resend = [e for e in store.events(tool_call_id=tool_call_id) if e.type == "tool_call.dispatching"][-1]
    assert (resend.payload["idempotency_key"], resend.payload["retry_of_attempt"]) == ("k-pay_invoice", 1)
    assert store.verify().ok
