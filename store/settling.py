"""The Store's lease and reconciliation methods (DESIGN §3.3, §3.5), one transaction each."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, Literal, TypeVar

from sqlalchemy import Connection

from store import leasing, reconciling
from store.model import CallView

T = TypeVar("T")


class Settlement:
    """Mixed into `Store`, which provides `_write` (one write transaction), `_read` and `_producer`."""

    _producer: str

    def _write(self, now: datetime, work: Callable[[Connection], T]) -> T:
        raise NotImplementedError

    def _read(self) -> AbstractContextManager[Connection]:
        raise NotImplementedError

    def recover_expired(self, *, now: datetime, limit: int = 100) -> list[CallView]:
        """Calls left `dispatching` past their lease become `result_unknown`, with the evidence known."""
        # Every worker tick runs this. Looking first, without the log's head lock, means a replica paused
        # in the middle of a tick with nothing to recover holds no lock every other writer waits on.
        with self._read() as conn:
            if not leasing.any_expired(conn, now=now):
                return []
        return self._write(
            now, lambda conn: leasing.recover_expired(conn, now=now, producer=self._producer, limit=limit)
        )

    def due_reconciliations(self, *, now: datetime, limit: int = 20) -> list[CallView]:
        """Unknown calls waiting for a lookup: not escalated, not leased, past their backoff."""
        with self._read() as conn:
            return reconciling.due(conn, now=now, limit=limit)

    def start_reconciliation(
        self,
        tool_call_id: str,
        *,
        expected_token: int,
        method: str,
        owner: str,
        lease_s: float,
        now: datetime,
    ) -> CallView:
        """Take the reconciliation lease (`reconciliation.started`); the view carries the new token.

        Raises:
            NotFound: no such call.
            StaleLease: another worker took it, or it was settled or escalated meanwhile.
        """
        return self._write(
            now,
            lambda conn: reconciling.start(
                conn,
                tool_call_id,
                expected_token=expected_token,
                method=method,
                owner=owner,
                lease_s=lease_s,
                now=now,
                producer=self._producer,
            ),
        )

    def record_inconclusive(
        self,
        tool_call_id: str,
        *,
        token: int,
        evidence: Mapping[str, Any],
        next_attempt_at: datetime,
        now: datetime,
    ) -> CallView:
        """A lookup could not tell; try again from `next_attempt_at`.

        Raises:
            NotFound, StaleLease.
        """
        return self._write(
            now,
            lambda conn: reconciling.inconclusive(
                conn,
                tool_call_id,
                token=token,
                evidence=evidence,
                next_attempt_at=next_attempt_at,
                now=now,
                producer=self._producer,
            ),
        )

    def resolve_reconciliation(
        self,
        tool_call_id: str,
        *,
        token: int,
        verdict: reconciling.Verdict,
        evidence: Mapping[str, Any],
        now: datetime,
        result: Mapping[str, Any] | None = None,
        detail: str | None = None,
    ) -> CallView:
        """The backend confirmed success (call `completed`) or failure (call `failed`).

        Raises:
            NotFound, StaleLease.
        """
        return self._write(
            now,
            lambda conn: reconciling.resolve(
                conn,
                tool_call_id,
                token=token,
                verdict=verdict,
                result=result,
                evidence=evidence,
                detail=detail,
                now=now,
                producer=self._producer,
            ),
        )

    def escalate_reconciliation(
        self,
        tool_call_id: str,
        *,
        token: int,
        reason: str,
        now: datetime,
        detail: str | None = None,
        evidence: Mapping[str, Any] | None = None,
    ) -> CallView:
        """Give up looking: the call waits for a human (`writ calls resolve`).

        Raises:
            NotFound, StaleLease.
        """
        return self._write(
            now,
            lambda conn: reconciling.escalate(
                conn,
                tool_call_id,
                token=token,
                reason=reason,
                detail=detail,
                evidence=evidence or {},
                now=now,
                producer=self._producer,
            ),
        )

    def redispatch(
        self,
        tool_call_id: str,
        *,
        token: int,
        owner: str,
        lease_s: float,
        now: datetime,
    ) -> CallView:
        """Re-send the same key (backends that deduplicate on it only): `dispatching`, next attempt.

        Raises:
            NotFound, StaleLease.
        """
        return self._write(
            now,
            lambda conn: reconciling.redispatch(
                conn,
                tool_call_id,
                token=token,
                owner=owner,
                lease_s=lease_s,
                now=now,
                producer=self._producer,
            ),
        )

    def resolve_manually(
        self,
        tool_call_id: str,
        *,
        succeeded: bool,
        evidence: str,
        by: str,
        now: datetime,
        tenant: str | None = None,
        break_glass: bool = False,
        reason: str | None = None,
    ) -> CallView:
        """A person settles an unknown or contradicted outcome with evidence, or contradicts a settled
        one (`reconciliation.contradicted`: the verdict stands, the call is escalated); recorded with who.

        Raises:
            NotFound: no such call (in `tenant`).
            StaleLease: nothing to settle and the person agrees with the settled verdict.
            StoreError: empty evidence or name.
        """
        return self._write(
            now,
            lambda conn: reconciling.resolve_by_human(
                conn,
                tool_call_id,
                succeeded=succeeded,
                evidence=evidence,
                by=by,
                now=now,
                producer=self._producer,
                tenant=tenant,
                break_glass=break_glass,
                reason=reason,
            ),
        )

    def record_contradiction(
        self,
        tool_call_id: str,
        *,
        source: Literal["lookup", "late_response", "resolution"],
        verdict: Literal["confirmed_success", "confirmed_failure"],
        evidence: Mapping[str, Any],
        detail: str | None,
        now: datetime,
    ) -> CallView | None:
        """Record evidence against a settled verdict (`reconciliation.contradicted`) and escalate the
        call; None when the call is not settled or the evidence agrees (nothing recorded).

        Raises:
            NotFound: no such call.
        """
        return self._write(
            now,
            lambda conn: reconciling.contradict(
                conn,
                tool_call_id,
                source=source,
                verdict=verdict,
                evidence=evidence,
                detail=detail,
                now=now,
                producer=self._producer,
            ),
        )
