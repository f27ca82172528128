"""Run controls for people: stop a run, resume it, and see what it did (its calls and budget use).

One service behind `POST /api/runs/{id}/stop|resume`, the console's runs page and `writ runs`: who may
stop (approver or admin of the run's tenant, or a break-glass operator at the CLI), the reason every
stop and resume records, and the refusals every face translates. The stop itself is the store's one
transaction under the head lock (`store.running`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from gateway.errors import Refused
from gateway.reasons import ReasonCode
from store.commands import ResumeRun, StopRun
from store.limits import SUBJECT_CHARS, refusal, text_unfit
from store.model import CallView, NotFound, RunView, StaleLease, StoredEvent
from store.ports import RunControls

RUN_CONTROL_ROLES = frozenset({"approver", "admin"})
"""Roles that stop and resume the runs of their tenant."""
MAX_REASON = 2000


@dataclass(frozen=True, slots=True)
class RunControl:
    """One stop or resume: of which run, by whom, why, and what they may do.

    `roles` and `tenant` are a verified principal's; both None for a break-glass operator at the CLI,
    who holds the store itself (recorded as such, never under another person's name).
    """

    run_id: str
    by: str
    reason: str
    roles: frozenset[str] | None
    tenant: str | None
    now: datetime

    @property
    def break_glass(self) -> bool:
        return self.roles is None


@dataclass(frozen=True, slots=True)
class BudgetUse:
    """What a run's calls drew on one budget: how many calls and how much (in the budget's unit)."""

    budget: str
    calls: int
    amount: float


@dataclass(frozen=True, slots=True)
class RunDetail:
    """A run as people see it: the run, its calls, and the budgets they drew on."""

    run: RunView
    calls: Sequence[CallView]
    budgets: Sequence[BudgetUse] = field(default_factory=tuple)


def stop_run(store: RunControls, control: RunControl) -> RunView:
    """Stop a run of the caller's tenant (blocking).

    Raises:
        Refused: the role is missing, the reason empty or unrecordable, no such run in the tenant,
            or the run is stopped already.
    """
    reason = _checked(control)
    command = StopRun(
        control.run_id,
        stopped_by=control.by,
        reason=reason,
        now=control.now,
        tenant=control.tenant,
        break_glass=control.break_glass,
    )
    try:
        return store.stop_run(command)
    except NotFound:
        raise Refused(ReasonCode.NOT_FOUND, "No such run") from None
    except StaleLease as exc:
        raise Refused(ReasonCode.RUN_ALREADY_STOPPED, str(exc)) from exc


def resume_run(store: RunControls, control: RunControl) -> RunView:
    """Resume a stopped run of the caller's tenant (blocking).

    Raises:
        Refused: the role is missing, the reason empty or unrecordable, no such run in the tenant,
            or the run is not stopped.
    """
    reason = _checked(control)
    command = ResumeRun(
        control.run_id,
        resumed_by=control.by,
        reason=reason,
        now=control.now,
        tenant=control.tenant,
        break_glass=control.break_glass,
    )
    try:
        return store.resume_run(command)
    except NotFound:
        raise Refused(ReasonCode.NOT_FOUND, "No such run") from None
    except StaleLease as exc:
        raise Refused(ReasonCode.RUN_NOT_STOPPED, str(exc)) from exc


def run_detail(store: RunControls, run_id: str, tenant: str | None) -> RunDetail | None:
    """The run of `tenant` (any tenant for None) with its calls and budget use, or None (blocking)."""
    run = store.get_run(run_id, tenant=tenant)
    if run is None:
        return None
    calls = store.run_calls(run_id)
    return RunDetail(run, calls, budget_use(store.events(run_id=run_id, tenant=run.tenant)))


def budget_use(events: Sequence[StoredEvent]) -> tuple[BudgetUse, ...]:
    """What the calls recorded in `events` drew on each budget, from their `tool_call.requested`."""
    calls: dict[str, int] = {}
    micros: dict[str, int] = {}
    for event in events:
        if event.type != "tool_call.requested":
            continue
        for charge in event.payload.get("charges") or ():
            budget = str(charge.get("budget"))
            calls[budget] = calls.get(budget, 0) + 1
            micros[budget] = micros.get(budget, 0) + int(charge.get("amount_micros") or 0)
    return tuple(BudgetUse(b, calls[b], micros[b] / 1_000_000) for b in sorted(calls))


def _checked(control: RunControl) -> str:
    if control.roles is not None and not control.roles & RUN_CONTROL_ROLES:
        raise Refused(
            ReasonCode.INSUFFICIENT_ROLE, "Stopping or resuming a run needs the approver or admin role"
        )
    reason = control.reason.strip()
    if not reason:
        raise Refused(ReasonCode.INVALID_REQUEST, "Say why: the reason is recorded and required")
    if len(reason) > MAX_REASON:
        raise Refused(ReasonCode.INVALID_REQUEST, f"the reason is over {MAX_REASON} characters")
    if (why := text_unfit(reason)) is not None:
        raise Refused(ReasonCode.INVALID_REQUEST, f"the reason {why}")
    if (message := refusal("the person", control.by, SUBJECT_CHARS)) is not None:
        raise Refused(ReasonCode.INVALID_REQUEST, message)
    return reason
