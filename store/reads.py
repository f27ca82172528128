"""The Store's reads: calls, approvals, runs and events from the projections and the log, and the audit.

Each read is one short transaction (`Store._read`: deferred on SQLite, one snapshot on PostgreSQL).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Row, bindparam, func, or_, select

from store import approving, audit, revoking
from store.events import parse_ts
from store.exporting import EventFilter, conditions
from store.log import PAGE_SIZE, envelope_of, read_pages, stored_event
from store.model import Anchor, ApprovalView, AuditReport, CallView, StoredEvent, StoreError
from store.partitions import UNPARTITIONED
from store.schema import approvals, budget_counters, effect_ledger, events, runs, tool_calls
from store.schema import log_head as head_row
from store.views import approval_view, call_view, load_approval, load_call

# Read before every call's policy check; built once, as SQLAlchemy caches the compiled form by its key.
_RUN_CALL_COUNT = select(runs.c.call_count).where(
    runs.c.run_id == bindparam("b_run_id"), runs.c.tenant == bindparam("b_tenant")
)


def _unstorable(*keys: str | None) -> bool:
    """Whether a lookup key is text no row can hold, so the lookup finds nothing without asking.

    PostgreSQL's text cannot contain NUL (asking raised a DataError, a 500 at every edge, where
    SQLite found nothing), and a lone surrogate cannot be encoded for either database.
    """
    for key in keys:
        if key is None:
            continue
        if "\x00" in key:
            return True
        try:
            key.encode("utf-8")
        except UnicodeEncodeError:
            return True
    return False


class Reads:
    """Mixed into `Store`, which provides `_read` (one read transaction), `_look` (a read that needs no
    snapshot across its statements) and `_settled_seq` (how far a reader by seq may go)."""

    def _read(self) -> AbstractContextManager[Connection]:
        raise NotImplementedError

    def _look(self) -> AbstractContextManager[Connection]:
        raise NotImplementedError

    def _settled_seq(self) -> int | None:
        raise NotImplementedError

    def is_revoked(self, tenant: str, subject: str) -> bool:
        """Whether `subject` has been revoked in `tenant`."""
        if _unstorable(tenant, subject):
            return False
        with self._read() as conn:
            return revoking.get(conn, tenant, subject) is not None

    def get_call(self, tool_call_id: str, *, tenant: str | None = None) -> CallView | None:
        """The call's current state; with `tenant`, only if the call belongs to that tenant."""
        if _unstorable(tool_call_id, tenant):
            return None
        with self._read() as conn:
            return load_call(conn, tool_call_id, tenant)

    def dispatched_at(self, tool_call_id: str) -> datetime | None:
        """When the call's latest dispatch (or recorded re-send) was recorded, just before it was sent."""
        times = self.dispatch_times(tool_call_id)
        return times[0] if times is not None else None

    def dispatch_times(self, tool_call_id: str) -> tuple[datetime, datetime | None] | None:
        """When the call's latest dispatch was recorded, and when the lease it was sent under ended."""
        row = self._latest_event(tool_call_id, "tool_call.dispatching")
        if row is None:
            return None
        lease_end = json.loads(row.payload).get("lease_expires_at")
        return parse_ts(row.occurred_at), parse_ts(lease_end) if lease_end else None

    def failed_by_hand_at(self, tool_call_id: str) -> datetime | None:
        """When a person last recorded the call `failed` to be looked up again (the `recheck_at` of
        their `reconciliation.resolved`); None if no one did."""
        row = self._latest_event(tool_call_id, "reconciliation.resolved")
        if row is None:
            return None
        payload = json.loads(row.payload)
        at = payload.get("recheck_at")
        return parse_ts(at) if payload.get("resolved_by") and at else None

    def _latest_event(self, tool_call_id: str, event_type: str) -> Row[Any, Any] | None:
        """The time and payload of the call's latest event of `event_type`; None if it has none."""
        if _unstorable(tool_call_id):
            return None
        query = (
            select(events.c.occurred_at, events.c.payload)
            .where(events.c.tool_call_id == tool_call_id, events.c.type == event_type)
            .order_by(events.c.seq.desc())
            .limit(1)
        )
        with self._read() as conn:
            return conn.execute(query).one_or_none()

    def find_call_by_key(self, tenant: str, subject: str, idempotency_key: str) -> CallView | None:
        """The call that currently holds `subject`'s `idempotency_key` in `tenant`."""
        query = (
            select(tool_calls)
            .join(effect_ledger, effect_ledger.c.tool_call_id == tool_calls.c.tool_call_id)
            .where(
                effect_ledger.c.tenant == tenant,
                effect_ledger.c.subject == subject,
                effect_ledger.c.idempotency_key == idempotency_key,
            )
        )
        if _unstorable(tenant, idempotency_key, subject):
            return None
        with self._read() as conn:
            row = conn.execute(query).one_or_none()
            return None if row is None else call_view(row)

    def budget_use(self, counter_keys: Iterable[str]) -> dict[str, int]:
        """What each named budget counter holds, in millionths of its unit (absent: nothing yet)."""
        keys = [k for k in counter_keys if not _unstorable(k)]
        if not keys:
            return {}
        query = select(budget_counters.c.counter_key, budget_counters.c.used_micros).where(
            budget_counters.c.counter_key.in_(keys)
        )
        with self._read() as conn:
            return {row.counter_key: int(row.used_micros) for row in conn.execute(query)}

    def run_call_count(self, run_id: str, tenant: str) -> int:
        """Calls recorded in the run so far (0 for an unknown run or another tenant's run)."""
        params = {"b_run_id": run_id, "b_tenant": tenant}
        if _unstorable(run_id, tenant):
            return 0
        with self._read() as conn:
            return conn.execute(_RUN_CALL_COUNT, params).scalar_one_or_none() or 0

    def list_calls(
        self,
        *,
        tenant: str | None = None,
        status: str | None = None,
        unresolved: bool = False,
        limit: int = 100,
    ) -> list[CallView]:
        """The newest calls first, optionally of one tenant and/or one status; `unresolved`: only those
        waiting for reconciliation or a person (unknown, or settled and then contradicted)."""
        c = tool_calls.c
        query = select(tool_calls).order_by(c.created_at.desc(), c.tool_call_id)
        if tenant is not None:
            query = query.where(c.tenant == tenant)
        if status is not None:
            query = query.where(c.status == status)
        if unresolved:
            query = query.where(or_(c.status == "result_unknown", c.verification_status == "inconclusive"))
        if _unstorable(tenant, status):
            return []
        with self._read() as conn:
            return [call_view(row) for row in conn.execute(query.limit(limit))]

    def waiting_counts(self) -> dict[str, int]:
        """How many calls wait on someone, by status: for an approver (`approval_pending`), or for
        evidence (`result_unknown`), over every tenant (for the gauges of `gateway.telemetry`)."""
        waiting = ("approval_pending", "result_unknown")
        query = (
            select(tool_calls.c.status, func.count())
            .where(tool_calls.c.status.in_(waiting))
            .group_by(tool_calls.c.status)
        )
        with self._read() as conn:
            found = {status: count for status, count in conn.execute(query)}
        return {status: int(found.get(status, 0)) for status in waiting}

    def events(
        self,
        *,
        run_id: str | None = None,
        tool_call_id: str | None = None,
        tenant: str | None = None,
        after_seq: int = 0,
        limit: int | None = None,
    ) -> list[StoredEvent]:
        """Events in seq order, filtered by run, call and/or tenant."""
        filters: list[Any] = []
        if run_id is not None:
            filters.append(events.c.run_id == run_id)
        if tool_call_id is not None:
            filters.append(events.c.tool_call_id == tool_call_id)
        if tenant is not None:
            filters.append(events.c.tenant == tenant)
        if _unstorable(run_id, tool_call_id, tenant):
            return []
        with self._read() as conn:
            return [stored_event(row) for row in read_pages(conn, *filters, after_seq=after_seq, limit=limit)]

    def get_approval(self, approval_id: str, *, tenant: str | None = None) -> ApprovalView | None:
        if _unstorable(approval_id, tenant):
            return None
        with self._read() as conn:
            return load_approval(conn, approval_id, tenant)

    def retry_requested_by(self, tool_call_id: str) -> str | None:
        """Who asked for this call as a retry of a failed call; None for a call nobody re-ran."""
        if _unstorable(tool_call_id):
            return None
        with self._read() as conn:
            return approving.retry_requested_by(conn, tool_call_id)

    def list_approvals(self, *, tenant: str | None = None, status: str | None = None) -> list[ApprovalView]:
        """Approvals oldest first, optionally of one tenant and/or one status."""
        query = select(approvals).order_by(approvals.c.created_at, approvals.c.approval_id)
        if tenant is not None:
            query = query.where(approvals.c.tenant == tenant)
        if status is not None:
            query = query.where(approvals.c.status == status)
        if _unstorable(tenant, status):
            return []
        with self._read() as conn:
            return [approval_view(row) for row in conn.execute(query)]

    def verify(self, anchors: Iterable[Anchor] = (), archive: Path | None = None) -> AuditReport:
        """Check the chain (from the files in `archive`, then the database) against the head and
        `anchors`, the grammar, and the projections (a replay)."""
        with self._read() as conn:
            return audit.verify(conn, anchors, archive)

    def log_head(self) -> tuple[int, str]:
        """The seq and hash of the newest event of partition "" (the whole log unless partitioned), as
        the head records them ((0, genesis) when empty)."""
        with self._read() as conn:
            head = conn.execute(
                select(head_row.c.last_seq, head_row.c.last_hash).where(head_row.c.partition == UNPARTITIONED)
            ).one_or_none()
        if head is None:
            raise StoreError("the log head row is missing: run `writ audit verify`")
        return head.last_seq, head.last_hash

    def partition_heads(self) -> dict[str, tuple[int, str]]:
        """Every partition's head: its seq and hash (one, "", unless the log is partitioned)."""
        with self._read() as conn:
            rows = conn.execute(select(head_row.c.partition, head_row.c.last_seq, head_row.c.last_hash))
            return {row.partition: (row.last_seq, row.last_hash) for row in rows}

    def event_hashes(self, after_seq: int, upto_seq: int, partition: str = UNPARTITIONED) -> list[str]:
        """The hashes of `partition`'s events after its seq `after_seq` up to `upto_seq`, in its seq order
        (those still in the database: archived ones are not)."""
        hashes: list[str] = []
        pseq, mine = events.c.pseq, events.c.partition == partition
        while after_seq < upto_seq:
            query = (
                select(pseq.label("seq"), events.c.hash)
                .where(mine, pseq > after_seq, pseq <= upto_seq)
                .order_by(pseq)
                .limit(PAGE_SIZE)
            )
            with self._read() as conn:
                page = conn.execute(query).all()
            if not page:
                break
            hashes.extend(row.hash for row in page)
            after_seq = page[-1].seq
        return hashes

    def export(
        self, given: EventFilter | None = None, *, after_seq: int = 0, limit: int | None = None
    ) -> Iterator[dict[str, Any]]:
        """The events `given` selects after `after_seq` (at most `limit`), as envelope dicts in seq
        order, one short read per page. Where seqs are not taken in the order of COMMIT (PostgreSQL,
        several partitions), only up to the highest seq below which none is in flight, so a cursor
        (the last seq read) never passes an event that commits later (`store.log.settled_seq`).

        Raises:
            CorruptEvent: a stored payload is not JSON.
        """
        given = given or EventFilter()
        if _unstorable(*given.keys()):
            return
        filters = conditions(given)
        remaining = limit
        while remaining is None or remaining > 0:
            size = PAGE_SIZE if remaining is None else min(PAGE_SIZE, remaining)
            settled = self._settled_seq()
            bound = filters if settled is None else [*filters, events.c.seq <= settled]
            with self._read() as conn:
                page = list(read_pages(conn, *bound, after_seq=after_seq, limit=size))
            yield from (envelope_of(row) for row in page)
            if len(page) < size:
                return
            after_seq = page[-1].seq
            if remaining is not None:
                remaining -= len(page)
