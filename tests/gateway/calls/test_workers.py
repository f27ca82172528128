"""The recovery, reconciliation and pruning worker runs only the kinds of work its look says are due, and
an idle pass is that look alone: no worker thread, no read, no write (fakes; the SQL look is tested
in tests/store/test_agenda.py, the work itself in test_reconcile.py)."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

import pytest

from gateway.calls.workers import Workers
from store.agenda import Due
from store.model import CallView
from tests.fakes import FakeAgenda
from tests.gateway.calls.test_resolutions import NOW, UNKNOWN
from tests.handoffs import hand_offs

pytestmark = pytest.mark.anyio

LEFT = dataclasses.replace(UNKNOWN, verification_status="pending", lease_owner="gw-a")
"""A call recovery just made `result_unknown`, its lookup still to come."""


class Spy:
    """The worker's store and reconciler: what each was asked, and what recovery finds."""

    def __init__(self, recovered: list[CallView] | None = None) -> None:
        self.asked: list[str] = []
        self.recovered = recovered or []

    def recover_expired(self, *, now: datetime, limit: int = 100) -> list[CallView]:
        self.asked.append("recover")
        return self.recovered

    def prune_expired(self, *, now: datetime, limit: int = 500) -> int:
        self.asked.append("prune")
        return 0

    async def run_once(self, limit: int = 20) -> int:
        self.asked.append("reconcile")
        return 0


def workers(spy: Spy, agenda: FakeAgenda) -> Workers:
    reconciler: Any = spy  # stands in for the Reconciler: only `run_once` is called
    return Workers(store=spy, agenda=agenda, reconciler=reconciler, clock=lambda: NOW, pruning=spy)


async def test_an_idle_pass_is_one_look_and_hands_nothing_to_a_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spy, agenda = Spy(), FakeAgenda()
    handed = hand_offs(monkeypatch)

    assert await workers(spy, agenda).tick() == (0, 0)
    assert (agenda.looks, spy.asked, handed) == ([NOW], [], [])


@pytest.mark.parametrize(
    ("due", "asked"),
    [
        (Due(expired_leases=True), ["recover"]),
        (Due(reconciliations=True), ["reconcile"]),
        (Due(prunable=True), ["prune"]),
        (Due(expired_leases=True, reconciliations=True, prunable=True), ["recover", "reconcile", "prune"]),
        # The resumer's kinds are not this worker's: it does nothing for them.
        (Due(approved=True, expired_approvals=True, expired_confirmations=True), []),
    ],
)
async def test_a_pass_runs_the_kinds_of_work_that_are_due_and_only_those(due: Due, asked: list[str]) -> None:
    spy = Spy()

    await workers(spy, FakeAgenda(due)).tick()

    assert spy.asked == asked


async def test_calls_recovered_in_a_pass_are_reconciled_in_the_same_pass() -> None:
    # The look came before the recovery made them unknown: it could not say they were due.
    spy = Spy(recovered=[LEFT, dataclasses.replace(LEFT, tool_call_id="tc-2")])

    assert await workers(spy, FakeAgenda(Due(expired_leases=True))).tick() == (2, 0)
    assert spy.asked == ["recover", "reconcile"]


async def test_each_pass_looks_again_so_work_that_became_due_meanwhile_is_done_next_pass() -> None:
    spy, agenda = Spy(), FakeAgenda()
    worker = workers(spy, agenda)
    await worker.tick()
    agenda.due = Due(expired_leases=True)  # another replica left a call dispatching

    await worker.tick()

    assert (len(agenda.looks), spy.asked) == (2, ["recover"])
