"""Count the times a PostgreSQL store's connections wait for the server: its round trips.

    python bench/round_trips.py [--calls 200]

`count_round_trips(engine)` makes every connection the engine opens from then on a psycopg
connection that counts, in one total, each exchange it waits on: a statement outside a pipeline (a
query, SAVEPOINT, COMMIT, and the BEGIN psycopg sends before a transaction's first statement), and
a pipeline's sync or fetch (however many statements went with it). Statements queued inside a
pipeline are not counted on their own: they travel with the next sync. The main prints the round
trips per read and per write of the store's hot path, one client (as `bench/store_writes.py` runs
it), so the count is seen next to the fsyncs `bench/run.py` reports.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import psycopg
from psycopg import pq
from sqlalchemy import Engine, event

HERE = Path(__file__).resolve().parents[1]
POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"

# Inside a pipeline, the exchanges that wait for the server: a sync (on leaving it, or asked for) and
# a fetch of a result not yet read. Every other wait there sends or reads what is already available.
_PIPELINE_WAITS = frozenset({"_sync_gen", "_exit_gen", "_fetch_gen"})
# Outside a transaction these send nothing: psycopg only notes the setting, or finds nothing to end.
_LOCAL = frozenset({"_set_autocommit_gen", "_commit_gen", "_rollback_gen"})


class RoundTrips:
    """A running count of one engine's round trips to PostgreSQL."""

    def __init__(self) -> None:
        self._counter = itertools.count()
        self._taken = 0

    def add(self) -> None:
        next(self._counter)  # atomic under the GIL, unlike `+= 1`

    @property
    def total(self) -> int:
        # itertools.count's repr is its next value: how many were taken, without taking one.
        return int(repr(self._counter)[6:-1])


def count_round_trips(engine: Engine) -> RoundTrips:
    """Count `engine`'s round trips from now on; the connections it already pooled are closed first."""
    trips = RoundTrips()

    class Counting(psycopg.Connection[Any]):
        def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
            name = getattr(getattr(gen, "gi_code", None), "co_name", "")
            idle = self.pgconn.transaction_status == pq.TransactionStatus.IDLE
            if name in _LOCAL and idle:
                pass
            elif self._pipeline is None or name in _PIPELINE_WAITS:
                trips.add()
                if idle and not self.autocommit and name not in _LOCAL:
                    trips.add()  # psycopg sent the transaction's BEGIN first, and waited for it
            elif name == "_execute_gen" and idle and not self.autocommit:
                trips.add()  # the first statement of a transaction in a pipeline: its BEGIN is synced alone
            return super().wait(gen, interval, timeout)

    @event.listens_for(engine, "do_connect")
    def _connect(_dialect: Any, _record: Any, cargs: Any, cparams: Any) -> Any:
        return Counting.connect(*cargs, **cparams)

    engine.dispose()
    return trips


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--url", default=os.environ.get("WRIT_BENCH_POSTGRES", POSTGRES_URL))
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    import dataclasses

    from store import OutcomeRecord, ReadRecord, Store
    from tests.postgres import fresh_schema
    from tests.store.builders import call_request, new_id, outcome

    answer = OutcomeRecord("completed", result={"content": [{"type": "text", "text": "order 1001"}]})

    def read_request() -> Any:
        req = call_request(
            tool_name="lookup_order",
            effect_class="read",
            dedupe_window_s=0,
            key_source="derived",
            idempotency_key=new_id("derived"),
            arguments={"order_id": "1001", "request": new_id("r")},
        )
        return dataclasses.replace(req, summary="look up order 1001")

    with tempfile.TemporaryDirectory(), fresh_schema(args.url, "writ_trips") as url, Store.open(url) as store:
        store.migrate()
        trips = count_round_trips(store.engine)
        for _ in range(20):  # warm: the pool, the compiled statements
            store.admit(call_request(idempotency_key=new_id("key")))
        admits = outcomes = 0
        for _ in range(args.calls):
            req = call_request(idempotency_key=new_id("key"))
            before = trips.total
            admission = store.admit(req)
            middle = trips.total
            token = admission.call.lease_token
            store.record_outcome(
                outcome(req.identity.tool_call_id, "completed", token=token, now=req.identity.now)
            )
            admits += middle - before
            outcomes += trips.total - middle
        reads = 0
        for _ in range(args.calls):
            req = read_request()
            before = trips.total
            store.admissible_read(req)
            store.record_read(ReadRecord(req, answer, observed_at=req.identity.now))
            reads += trips.total - before
        print(f"round trips per read call (admissible_read + record_read): {reads / args.calls:.2f}")
        print(f"round trips per admission: {admits / args.calls:.2f}")
        print(f"round trips per outcome:   {outcomes / args.calls:.2f}")
        print(f"round trips per write call (admission + outcome): {(admits + outcomes) / args.calls:.2f}")


if __name__ == "__main__":
    main()
