"""The store's hot write path alone: admit an allowed call, then record its outcome, on SQLite and PostgreSQL.

    python bench/store_writes.py [--calls 2000] [--rounds 5] [--stores sqlite,postgres] [--tree DIR]
    python bench/store_writes.py --reads [--calls 500] [--rounds 4] [--stores sqlite,postgres]

No gateway, no network, no MCP: each write is one `Store.admit` (intent, decision, key claimed,
dispatching) and one `Store.record_outcome` (completed), as the pipeline runs them for a call that
policy allows. Reports, per store, the median over rounds of the wall time and the CPU time
(`time.process_time`, this process only: for PostgreSQL the server's own CPU is not in it) per write.
`--tree DIR` imports the store from another source tree (e.g. `git archive <commit> | tar -x -C DIR`),
so two commits can be compared on the same machine, one after the other. The load average is printed,
since 2 shared cores move these figures more than most changes do.

`--reads` records allowed reads (derived keys, each with its own arguments) both ways, alternating
round by round in one process: as every call was recorded before issue 16 (`admit`, then
`record_outcome`: two commits) and as a read is now (`admissible_read`, then `record_read`: one
commit), and counts the writing transactions each way. It needs a tree with `record_read`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"


def run(url: str, calls: int, rounds: int) -> tuple[float, float]:
    """Median wall and CPU microseconds per write (admit + record outcome) over `rounds`."""
    from store import Store
    from tests.store.builders import call_request, new_id, outcome

    walls: list[float] = []
    cpus: list[float] = []
    with Store.open(url) as store:
        store.migrate()
        for _ in range(rounds + 1):  # the first round warms up the pool and the compiled statements
            requests = [call_request(idempotency_key=new_id("key")) for _ in range(calls)]
            wall, cpu = time.perf_counter(), time.process_time()
            for req in requests:
                admission = store.admit(req)
                token = admission.call.lease_token
                store.record_outcome(
                    outcome(req.identity.tool_call_id, "completed", token=token, now=req.identity.now)
                )
            walls.append((time.perf_counter() - wall) / calls * 1e6)
            cpus.append((time.process_time() - cpu) / calls * 1e6)
    return statistics.median(walls[1:]), statistics.median(cpus[1:])


def run_reads(url: str, calls: int, rounds: int) -> dict[str, tuple[float, float, float]]:
    """Per way of recording a read: median wall and CPU µs per read over `rounds`, and commits per read."""
    import dataclasses

    from sqlalchemy import event

    from store import OutcomeRecord, ReadRecord, Store
    from store.db import READ_ONLY
    from tests.store.builders import call_request, new_id, outcome

    answer = OutcomeRecord("completed", result={"content": [{"type": "text", "text": "order 1001"}]})

    def request() -> object:
        req = call_request(
            tool_name="lookup_order",
            effect_class="read",
            dedupe_window_s=0,
            key_source="derived",
            idempotency_key=new_id("derived"),
            arguments={"order_id": "1001", "request": new_id("r")},
            run_id=new_id("run"),
            run_origin="client",
        )
        return dataclasses.replace(req, summary="look up order 1001")

    def two_commits(req: Any) -> None:
        admission = store.admit(req)
        store.record_outcome(
            outcome(
                req.identity.tool_call_id, "completed", token=admission.call.lease_token, now=req.identity.now
            )
        )

    def one_commit(req: Any) -> None:
        store.admissible_read(req)
        store.record_read(ReadRecord(req, answer, observed_at=req.identity.now))

    ways = {"two commits (admit, record_outcome)": two_commits, "one commit (record_read)": one_commit}
    seen: dict[str, list[tuple[float, float, float]]] = {name: [] for name in ways}
    commits = [0]

    def count(conn: Any) -> None:
        if not conn.get_execution_options().get(READ_ONLY):
            commits[0] += 1

    with Store.open(url) as store:
        store.migrate()
        event.listen(store.engine, "commit", count)
        for n in range(rounds + 1):  # the first round of each way warms up
            for name, way in ways.items():
                requests = [request() for _ in range(calls)]
                commits[0] = 0
                wall, cpu = time.perf_counter(), time.process_time()
                for req in requests:
                    way(req)
                took = ((time.perf_counter() - wall) / calls * 1e6, (time.process_time() - cpu) / calls * 1e6)
                if n:
                    seen[name].append((*took, commits[0] / calls))
    return {
        name: (
            statistics.median(r[0] for r in runs),
            statistics.median(r[1] for r in runs),
            statistics.median(r[2] for r in runs),
        )
        for name, runs in seen.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--stores", default="sqlite,postgres")
    parser.add_argument("--tree", type=Path, default=None, help="import store/ from this source tree")
    parser.add_argument("--reads", action="store_true", help="a read recorded in two commits and in one")
    args = parser.parse_args()
    tree = (args.tree or HERE).resolve()
    sys.path.insert(0, str(HERE))  # tests.store.builders, from this tree
    sys.path.insert(0, str(tree))
    print(f"tree {tree}  load average {os.getloadavg()[0]:.2f} at start")
    for name in args.stores.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            if args.reads:
                if name == "sqlite":
                    results = run_reads(f"sqlite:///{tmp}/writ.db", args.calls, args.rounds)
                else:
                    from tests.postgres import fresh_schema

                    with fresh_schema(POSTGRES_URL) as url:
                        results = run_reads(url, args.calls, args.rounds)
                for way, (wall, cpu, commits) in results.items():
                    print(
                        f"{name:9} {way:36} {wall:8.0f} µs/read wall  {cpu:8.0f} µs/read CPU  "
                        f"{commits:.2f} commits/read"
                    )
                continue
            if name == "sqlite":
                wall, cpu = run(f"sqlite:///{tmp}/writ.db", args.calls, args.rounds)
            else:
                from tests.postgres import fresh_schema

                with fresh_schema(POSTGRES_URL) as url:
                    wall, cpu = run(url, args.calls, args.rounds)
        print(f"{name:9} {wall:8.0f} µs/write wall  {cpu:8.0f} µs/write CPU (this process)")
    print(f"load average {os.getloadavg()[0]:.2f} at end")


if __name__ == "__main__":
    main()
