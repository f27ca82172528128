"""What the periodic passes look at before they do anything: which kinds of work are due, and how far the
log has grown.

Every replica passes once a second or so (gateway.calls.periodic), and most passes find nothing. A pass
that asked each kind of work in turn paid, every second, a transaction per kind (and a write for
pruning), each on a pooled connection in a worker thread. A pass looks here first instead: one
statement, on the connection the event loop keeps for its looks (store.looking), answers for every
kind at once, and the pass runs only the kinds it reports due.

The answer is a hint, never a decision. The work that runs takes its locks and re-reads its rows as it
always did, so a kind that stopped being due since the look costs a pass that finds nothing, and one
that became due just after the look is found by the next pass. The look reads the shared tables, so
work another replica left (a call it left dispatching) is seen within one interval, as before. Each
condition is the one its work selects with (`expired_dispatch`, `due_for_lookup`, ...), so the hint
and the work cannot disagree about what is due.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import BindParameter, Connection, Exists, Table, bindparam, func, literal_column, or_, select

from store.confirming import expired_confirmation
from store.leasing import expired_dispatch
from store.pruning import GRACE, some_ended
from store.queues import expired_approval
from store.raw import Statement
from store.reconciling import due_for_lookup, due_for_recheck
from store.schema import approvals, log_head, tool_calls


@dataclass(frozen=True, slots=True)
class Due:
    """Which kinds of background work the store holds that are due now (a hint: see the module)."""

    expired_leases: bool = False
    """A call left `dispatching` past its lease: recovery makes it `result_unknown`."""
    reconciliations: bool = False
    """A `result_unknown` call waiting for a lookup, past its backoff and not leased; or a `failed`
    call due for a re-check of its verdict."""
    approved: bool = False
    """An approved call waiting to be resumed."""
    expired_approvals: bool = False
    """An approval still awaiting a decision past its expiry."""
    expired_confirmations: bool = False
    """A call still awaiting its user's confirmation past its expiry."""
    prunable: bool = False
    """A budget counter or loop mark whose window ended `GRACE` ago."""


_NOW: BindParameter[datetime] = bindparam("b_now")
_BEFORE: BindParameter[datetime] = bindparam("b_before")


def _any(table: Table, *where: Any) -> Exists:
    return select(literal_column("1")).select_from(table).where(*where).exists()


_DUE = Statement(
    select(
        _any(tool_calls, *expired_dispatch(_NOW)).label("expired_leases"),
        or_(_any(tool_calls, *due_for_lookup(_NOW)), _any(tool_calls, *due_for_recheck(_NOW))).label(
            "reconciliations"
        ),
        _any(tool_calls, tool_calls.c.status == "approved").label("approved"),
        _any(approvals, *expired_approval(_NOW)).label("expired_approvals"),
        _any(tool_calls, *expired_confirmation(_NOW)).label("expired_confirmations"),
        some_ended(_BEFORE).label("prunable"),
    )
)
"""Built once, compiled once per dialect (store.raw): a pass's look builds no SQL."""

_APPENDED = Statement(select(func.coalesce(func.sum(log_head.c.last_seq), 0).label("appended")))


def due(conn: Connection, *, now: datetime) -> Due:
    """Which kinds of work are due at `now`, in one statement that takes no lock."""
    row = _DUE.one(conn, {"b_now": now, "b_before": now - GRACE})
    return Due(
        expired_leases=bool(row.expired_leases),
        reconciliations=bool(row.reconciliations),
        approved=bool(row.approved),
        expired_approvals=bool(row.expired_approvals),
        expired_confirmations=bool(row.expired_confirmations),
        prunable=bool(row.prunable),
    )


def appended(conn: Connection) -> int:
    """How many events were ever appended to the log: the sum of every partition's head seq."""
    return int(_APPENDED.one(conn, {}).appended)
