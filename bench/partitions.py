"""Commit rate of the log with one partition and with one per tenant, from several replicas (issue 16 item 7).

    python bench/partitions.py [--replicas 2] [--threads 8] [--seconds 8] [--tenants 1,8]
                               [--stores postgres,sqlite]

No gateway and no network: each replica is a process with its own `Store` (its own group writer and
pool, as a `writ serve` replica has) on one database; its threads each record calls (one
`Store.admit` of an allowed call and one `Store.record_outcome`: the two commits of a write) for
`--seconds`, call n in tenant n mod T. With T = 1 every commit of every replica takes the same log
head; with `store.log.partition_by: tenant` and T tenants, commits of different tenants take
different heads. Printed per row: calls/s and transactions/s over all replicas, writes per
transaction (group commit; a call is two writes), the head-lock hold time per transaction (from
taking the first head to the end of COMMIT, `GroupWriter.head_holds`: mean, p50, p99) and the
transactions started again to take heads in order. SQLite has one writer whatever the partitions:
its rows give the hold time. `--routed` sends each replica its own half of the tenants (tenants
routed to replicas, e.g. by a load balancer keyed on the tenant); without it every replica serves
every tenant, and a group-commit batch holds the heads of every tenant in it.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
ROUTE = 2
"""Replicas when `--routed`: replica r serves the tenants congruent to r modulo this."""
POSTGRES_URL = os.environ.get("WRIT_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


def replica(
    url: str, by: str, tenants: int, threads: int, seconds: float, start: Any, out: Any, home: int | None
) -> None:
    sys.path.insert(0, str(HERE))
    from store import Store
    from store.partitions import Partitioning
    from tests.store.builders import call_request, new_id, outcome

    partitioning = Partitioning("tenant") if by == "tenant" else Partitioning()
    counts = [0] * threads
    with Store.open(url, partitioning=partitioning, pool_size=threads + 2) as store:
        store.admit(call_request(idempotency_key=new_id("warm")))  # pool, statements, heads

        def work(index: int, deadline: float) -> None:
            n = index
            while time.perf_counter() < deadline:
                # Routed: this replica serves tenants home, home + replicas, ... (home is its index).
                tenant = f"t{n % tenants}" if home is None else f"t{(home + n * ROUTE) % tenants}"
                req = call_request(idempotency_key=new_id("k"), tenant=tenant, run_id=f"run-{tenant}")
                token = store.admit(req).call.lease_token
                store.record_outcome(
                    outcome(req.identity.tool_call_id, "completed", token=token, now=req.identity.now)
                )
                counts[index] += 1
                n += threads

        writer = store.writer
        holds0, batches0, writes0 = writer.head_holds.count, writer.batches, writer.writes
        start.wait()
        deadline = time.perf_counter() + seconds
        workers = [threading.Thread(target=work, args=(i, deadline)) for i in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        holds = list(writer.head_holds.recent)[-(writer.head_holds.count - holds0) :]
        out.put(
            {
                "calls": sum(counts),
                "transactions": writer.batches - batches0,
                "writes": writer.writes - writes0,
                "holds": holds,
                "reorders": writer.reorders,
            }
        )


def measure(
    url: str, by: str, tenants: int, replicas: int, threads: int, seconds: float, routed: bool
) -> dict[str, float]:
    context = multiprocessing.get_context("spawn")
    start, out = context.Event(), context.Queue()
    procs = [
        context.Process(
            target=replica,
            args=(url, by, tenants, threads, seconds, start, out, r if routed and tenants > 1 else None),
        )
        for r in range(replicas)
    ]
    for p in procs:
        p.start()
    time.sleep(3)  # each replica imports, connects and warms up before the clock starts
    start.set()
    results = [out.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join()
    holds = sorted(h for r in results for h in r["holds"])
    transactions = sum(r["transactions"] for r in results)
    return {
        "calls_s": sum(r["calls"] for r in results) / seconds,
        "tx_s": transactions / seconds,
        "per_tx": sum(r["writes"] for r in results) / max(transactions, 1),
        "hold_mean_ms": statistics.fmean(holds) * 1e3 if holds else 0.0,
        "hold_p50_ms": holds[len(holds) // 2] * 1e3 if holds else 0.0,
        "hold_p99_ms": holds[int(len(holds) * 0.99)] * 1e3 if holds else 0.0,
        "reorders": sum(r["reorders"] for r in results),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--tenants", default="1,8")
    parser.add_argument("--stores", default="postgres,sqlite")
    parser.add_argument(
        "--routed", action="store_true", help="each replica serves its own tenants (2 replicas)"
    )
    args = parser.parse_args()
    if args.routed and args.replicas != ROUTE:
        parser.error(f"--routed needs --replicas {ROUTE}")
    sys.path.insert(0, str(HERE))
    from store import Store
    from tests.postgres import fresh_schema

    load = os.getloadavg()[0]
    print(f"load average {load:.1f}; {args.replicas} replicas x {args.threads} threads, {args.seconds}s")
    print("store     partitions        calls/s  tx/s  writes/tx hold mean  p50    p99    reorders")
    for kind in args.stores.split(","):
        for tenants in (int(t) for t in args.tenants.split(",")):
            by = "none" if tenants == 1 else "tenant"
            replicas = args.replicas if kind == "postgres" else 1
            if kind == "postgres":
                with fresh_schema(POSTGRES_URL, "writ_bench") as url:
                    with Store.open(url) as store:
                        store.migrate()
                    row = measure(url, by, tenants, replicas, args.threads, args.seconds, args.routed)
            else:
                with tempfile.TemporaryDirectory() as tmp:
                    url = f"sqlite:///{tmp}/writ.db"
                    with Store.open(url) as store:
                        store.migrate()
                    row = measure(url, by, tenants, replicas, args.threads, args.seconds, args.routed)
            label = "1 (none)" if by == "none" else f"{tenants} (tenant{', routed' if args.routed else ''})"
            print(
                f"{kind:9} {label:16} {row['calls_s']:8.0f} {row['tx_s']:5.0f} {row['per_tx']:8.2f}"
                f"  {row['hold_mean_ms']:6.2f} ms {row['hold_p50_ms']:5.2f}  {row['hold_p99_ms']:5.2f}"
                f"  {row['reorders']:5.0f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
