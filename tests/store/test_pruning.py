"""Budget counters and loop marks of ended windows are pruned in bounded batches, on both stores; the
current windows' rows stay, the log keeps everything, and `verify` still catches a tampered live row."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, select

from store import LoopKey, Store
from store.model import Charge
from store.pruning import GRACE
from store.schema import budget_counters, loop_marks
from tests.store.builders import NOW, call_request
from tests.store.racing import at_once

M = 1_000_000
HOUR = timedelta(hours=1)
START = NOW.replace(minute=0, second=0, microsecond=0)


def _charge(key: str, start: datetime | None) -> Charge:
    resets = None if start is None else start + HOUR
    return Charge("calls", key, M, 100 * M, start, resets, "principal")


def _loop(pattern: str, start: datetime) -> LoopKey:
    return LoopKey("same-call", "repeated_action", pattern, 100, 3600, start, start + HOUR)


def _admit(store: Store, n: int, start: datetime, *, run_budget: bool = False) -> None:
    charges = (_charge(f"counter-{n}", start),) + ((_charge("run-counter", None),) if run_budget else ())
    store.admit(
        call_request(
            tool_call_id=f"tc-{n}", idempotency_key=f"k-{n}", charges=charges, loops=(_loop(f"p-{n}", start),)
        )
    )


def _keys(store: Store) -> tuple[set[str], set[str]]:
    with store.engine.connect() as conn:
        counters = set(conn.execute(select(budget_counters.c.counter_key)).scalars())
        marks = set(conn.execute(select(loop_marks.c.pattern_key)).scalars())
    return counters, marks


def test_rows_of_ended_windows_are_pruned_and_the_current_windows_and_a_runs_kept(store: Store) -> None:
    _admit(store, 1, START, run_budget=True)
    _admit(store, 2, START + HOUR)

    too_soon = store.prune_expired(now=START + HOUR + GRACE - timedelta(seconds=1))
    pruned = store.prune_expired(now=START + HOUR + GRACE + timedelta(seconds=1))

    assert (too_soon, pruned) == (0, 2)
    assert _keys(store) == ({"counter-2", "run-counter"}, {"p-2"})
    assert store.verify().ok  # the log keeps the charges; an ended window's row may be missing
    store.rebuild()
    assert _keys(store) == ({"counter-1", "counter-2", "run-counter"}, {"p-1", "p-2"})


def test_a_pass_deletes_a_bounded_batch_and_later_passes_drain_the_rest(store: Store) -> None:
    for n in range(5):
        _admit(store, n, START)
    later = START + HOUR + GRACE + timedelta(minutes=1)

    passes = [store.prune_expired(now=later, limit=2) for _ in range(4)]

    assert passes == [4, 4, 2, 0]
    assert _keys(store) == (set(), set())
    assert store.verify().ok


def test_replicas_pruning_at_once_delete_each_row_once(store: Store, migrated_url: str) -> None:
    for n in range(30):
        _admit(store, n, START)
    later = START + HOUR + GRACE + timedelta(minutes=1)

    with Store.open(migrated_url) as other:
        deleted = at_once(lambda s: s.prune_expired(now=later, limit=1000), [store, other, store, other])

    assert sum(deleted) == 60
    assert _keys(store) == (set(), set())


def test_verify_still_reports_a_live_windows_counter_deleted_by_hand(store: Store) -> None:
    # A window that began now ends an hour from now: one aligned to the hour could end between the
    # admit and `verify` (a run at 12:59:59 did), and an ended window's row may be missing.
    current = datetime.now(UTC).replace(microsecond=0)
    _admit(store, 1, current)
    with store.engine.begin() as conn:
        conn.execute(delete(budget_counters).where(budget_counters.c.counter_key == "counter-1"))

    report = store.verify()

    assert not report.ok
    assert report.projection_difference is not None
    assert report.projection_difference.table == "budget_counters"
