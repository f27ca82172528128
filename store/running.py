"""Run controls: `run.stopped` and `run.resumed`, and the `runs` projection people read.

A stop is one transaction under the head lock: the run's row becomes `stopped` (every later admission
reads it there and refuses the call `run_stopped`), each approval of the run still awaiting a decision
is withdrawn (an `approval.rejected` by the stopper, marked `withdrawn: run_stopped`, caused by the
stop), each call approved but not yet dispatched is denied `run_stopped`, and each call awaiting the
user's confirmation ends (`confirmation.expired` with reason `run_stopped`). Calls already dispatching
settle as they would have: their effect may be under way, and Writ never abandons one.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import Connection, Row, select

from store import events as ev
from store import queues
from store.commands import ResumeRun, StopRun
from store.leasing import call_envelope
from store.log import Append
from store.model import CallView, NotFound, RunView, StaleLease
from store.reads import _unstorable
from store.schema import approvals, runs, tool_calls
from store.views import call_view

RUN_STOPPED = "run_stopped"
WRIT = "writ"
"""Who stopped a run that Writ paused itself (a loop rule's `on_detect: pause_run`)."""
T = TypeVar("T")


def stop(conn: Connection, cmd: StopRun, *, producer: str) -> RunView:
    """Stop an active run, withdrawing its waiting approvals and refusing its approved calls.

    Raises:
        NotFound: no such run (in the stopper's tenant).
        StaleLease: the run is already stopped (nothing is recorded).
    """
    log = Append(conn)  # the head lock first: admissions, decisions and other stops wait for this one
    run = _run(conn, cmd.run_id, cmd.tenant)
    if run.status == "stopped":
        raise StaleLease(f"run {cmd.run_id} is already stopped (by {run.stopped_by})")
    halt(conn, log, cmd, run.tenant, producer=producer)
    return _run(conn, cmd.run_id, None)


def halt(
    conn: Connection,
    log: Append,
    cmd: StopRun,
    tenant: str,
    *,
    producer: str,
    caused_by: str | None = None,
) -> None:
    """Append the stop of an active run to `log` (which holds the head lock) and flush it: the run's
    waiting approvals withdrawn, its approved calls denied, its confirmations ended. `stop` for a
    person; a loop rule's `pause_run` for Writ, with the event that found the loop as `caused_by`."""
    waiting = conn.execute(
        select(tool_calls)
        .join(approvals, approvals.c.approval_id == tool_calls.c.approval_id)
        .where(tool_calls.c.run_id == cmd.run_id, approvals.c.status == "awaiting_approval")
        .order_by(tool_calls.c.created_at, tool_calls.c.tool_call_id)
    ).all()
    approved = conn.execute(
        select(tool_calls)
        .where(tool_calls.c.run_id == cmd.run_id, tool_calls.c.status == "approved")
        .order_by(tool_calls.c.created_at, tool_calls.c.tool_call_id)
    ).all()
    unconfirmed = conn.execute(
        select(tool_calls)
        .where(tool_calls.c.run_id == cmd.run_id, tool_calls.c.status == "awaiting_confirmation")
        .order_by(tool_calls.c.created_at, tool_calls.c.tool_call_id)
    ).all()
    stopped = log.add(
        ev.RunStoppedEvent(
            occurred_at=ev.format_ts(cmd.now),
            producer=producer,
            run_id=cmd.run_id,
            tenant=tenant,
            causation_id=caused_by,
            payload=ev.RunStopped(
                stopped_by=cmd.stopped_by,
                reason=cmd.reason,
                break_glass=cmd.break_glass,
                withdrawn=[row.approval_id for row in waiting] or None,
            ),
        )
    )
    why = f"withdrawn: run {cmd.run_id} was stopped by {cmd.stopped_by}: {cmd.reason}"
    for row in waiting:
        payload = ev.ApprovalDecided(
            decided_by=cmd.stopped_by, reason=why, break_glass=cmd.break_glass, withdrawn="run_stopped"
        )
        log.add(ev.ApprovalRejectedEvent(**_caused(row, cmd, producer, stopped), payload=payload))
        queues.release(conn, row.approval_id)
    for row in approved:
        denied = ev.ToolCallDenied(reason=RUN_STOPPED, detail=f"run {cmd.run_id} was stopped before it ran")
        log.add(ev.ToolCallDeniedEvent(**_caused(row, cmd, producer, stopped), payload=denied))
        queues.release(conn, row.approval_id)
    for row in unconfirmed:
        # The user's answer can no longer run it: the confirmation ends here, as an expiry would.
        ended = ev.ConfirmationExpired(confirmation_id=row.confirmation_id, reason=RUN_STOPPED)
        log.add(ev.ConfirmationExpiredEvent(**_caused(row, cmd, producer, stopped), payload=ended))
    log.flush()


def resume(conn: Connection, cmd: ResumeRun, *, producer: str) -> RunView:
    """Resume a stopped run: its later calls are admitted again.

    Raises:
        NotFound: no such run (in the resumer's tenant).
        StaleLease: the run is not stopped (nothing is recorded).
    """
    log = Append(conn)
    run = _run(conn, cmd.run_id, cmd.tenant)
    if run.status != "stopped":
        raise StaleLease(f"run {cmd.run_id} is not stopped")
    log.add(
        ev.RunResumedEvent(
            occurred_at=ev.format_ts(cmd.now),
            producer=producer,
            run_id=cmd.run_id,
            tenant=run.tenant,
            payload=ev.RunResumed(resumed_by=cmd.resumed_by, reason=cmd.reason, break_glass=cmd.break_glass),
        )
    )
    log.flush()
    return _run(conn, cmd.run_id, None)


def get(conn: Connection, run_id: str, tenant: str | None) -> RunView | None:
    """The run, if it exists (in `tenant`, when one is given)."""
    query = select(runs).where(runs.c.run_id == run_id)
    if tenant is not None:
        query = query.where(runs.c.tenant == tenant)
    row = conn.execute(query).one_or_none()
    return None if row is None else run_view(row)


def listed(
    conn: Connection, *, tenant: str | None, status: str | None, subject: str | None, limit: int
) -> list[RunView]:
    """Runs newest first, filtered by tenant, status and subject."""
    query = select(runs).order_by(runs.c.started_at.desc(), runs.c.run_id).limit(limit)
    if tenant is not None:
        query = query.where(runs.c.tenant == tenant)
    if status is not None:
        query = query.where(runs.c.status == status)
    if subject is not None:
        query = query.where(runs.c.subject == subject)
    return [run_view(row) for row in conn.execute(query)]


def run_view(row: Row[Any]) -> RunView:
    return RunView(
        run_id=row.run_id,
        tenant=row.tenant,
        subject=row.subject,
        started_at=row.started_at,
        call_count=row.call_count,
        origin=row.origin,
        status=row.status,
        stopped_at=row.stopped_at,
        stopped_by=row.stopped_by,
        stop_reason=row.stop_reason,
    )


def _run(conn: Connection, run_id: str, tenant: str | None) -> RunView:
    found = get(conn, run_id, tenant)
    if found is None:
        raise NotFound(f"no run {run_id}")
    return found


def _caused(row: Row[Any], cmd: StopRun, producer: str, stopped: ev.Event) -> dict[str, Any]:
    envelope = call_envelope(row, cmd.now, producer)
    envelope["causation_id"] = stopped.event_id
    return envelope


class Runs:
    """Mixed into `Store`, which provides `_write` (one write transaction), `_read` and `_producer`."""

    _producer: str

    def _write(self, now: datetime, work: Callable[[Connection], T]) -> T:
        raise NotImplementedError

    def _read(self) -> AbstractContextManager[Connection]:
        raise NotImplementedError

    def stop_run(self, cmd: StopRun) -> RunView:
        """Stop a run (see `stop`).

        Raises:
            NotFound: no such run in the tenant.
            StaleLease: the run is already stopped.
        """
        return self._write(cmd.now, lambda conn: stop(conn, cmd, producer=self._producer))

    def resume_run(self, cmd: ResumeRun) -> RunView:
        """Resume a stopped run (see `resume`).

        Raises:
            NotFound: no such run in the tenant.
            StaleLease: the run is not stopped.
        """
        return self._write(cmd.now, lambda conn: resume(conn, cmd, producer=self._producer))

    def get_run(self, run_id: str, *, tenant: str | None = None) -> RunView | None:
        """The run, or None (also for a run of another tenant than `tenant`)."""
        if _unstorable(run_id, tenant):
            return None
        with self._read() as conn:
            return get(conn, run_id, tenant)

    def list_runs(
        self,
        *,
        tenant: str | None = None,
        status: str | None = None,
        subject: str | None = None,
        limit: int = 100,
    ) -> list[RunView]:
        """Runs newest first, optionally of one tenant, status and/or subject."""
        if _unstorable(tenant, status, subject):
            return []
        with self._read() as conn:
            return listed(conn, tenant=tenant, status=status, subject=subject, limit=limit)

    def run_calls(self, run_id: str, *, limit: int = 200) -> list[CallView]:
        """The run's calls, oldest first."""
        if _unstorable(run_id):
            return []
        query = (
            select(tool_calls)
            .where(tool_calls.c.run_id == run_id)
            .order_by(tool_calls.c.created_at, tool_calls.c.tool_call_id)
            .limit(limit)
        )
        with self._read() as conn:
            return [call_view(row) for row in conn.execute(query)]
