"""CPU per read of the call pipeline and the store alone: no HTTP, no MCP, no backend process.

    python bench/pipeline_reads.py [--store sqlite|postgres] [--calls 300] [--rounds 5]

`CallPipeline.call` of a read allowed outright (each with arguments of its own, as an agent sends them)
on a real, durable store, with a scripted executor (`capabilities.fake`) answering at once: the
pipeline's own work (ids, hashes, policy), the read's look before it runs and its one commit, with
every thread hand-off between them. Prints the median over rounds (after one of warm-up) of this
process's CPU per read (`time.process_time`, all threads; PostgreSQL's server not included) and the
load average. For a count the load does not move, run it under callgrind twice and subtract, so that
startup cancels: `valgrind --tool=callgrind python bench/pipeline_reads.py --calls 40 --rounds 1`, then
`--rounds 4`; the difference of the two totals over 120 reads is the instructions per read.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from capabilities.fake import FakeExecutor, completed, fake_capability  # noqa: E402
from capabilities.registry import Registry  # noqa: E402
from gateway.calls.actions import Redactor  # noqa: E402
from gateway.calls.dispatch import Dispatcher  # noqa: E402
from gateway.calls.pipeline import CallInput, CallPipeline  # noqa: E402
from policy.engine import Policy  # noqa: E402
from policy.model import Principal  # noqa: E402
from store.store import Store  # noqa: E402

POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
SCHEMA = {
    "type": "object",
    "properties": {"order_id": {"type": "string"}, "request": {"type": "string"}},
    "required": ["order_id"],
}
LOOKUP = fake_capability("lookup_order", effect="read", input_schema=SCHEMA, timeout_s=5)
AGENT = Principal("agent", tenant="acme", roles=frozenset({"agent"}))
ALLOW = {"id": "agents", "tools": ["*"], "roles": ["agent"], "decision": "allow"}


def measure(url: str, calls: int, rounds: int) -> list[float]:
    """CPU µs per read in each round after the first."""
    store = Store.open(url)
    store.migrate()
    registry = Registry({"fake": FakeExecutor(default=completed({"order_id": "1001"}))}, [LOOKUP])
    redactor = Redactor(b"salt")
    rules = Policy.from_mapping({"rules": [ALLOW]})
    clock = lambda: datetime.now(UTC)  # noqa: E731
    dispatcher = Dispatcher(store=store, registry=registry, redactor=redactor, clock=clock)
    pipeline = CallPipeline(
        store=store, registry=registry, policy=lambda: rules, redactor=redactor, dispatcher=dispatcher
    )
    pipeline.prepare()
    cpus: list[float] = []

    async def drive() -> None:
        n = 0
        for r in range(rounds + 1):
            cpu = time.process_time()
            for _ in range(calls):
                n += 1
                arguments = {"order_id": "1001", "request": f"r{n}"}
                report = await pipeline.call(CallInput(AGENT, "lookup_order", arguments))
                if report.call.status != "completed":
                    raise RuntimeError(f"read {n} ended {report.call.status}")
            if r:
                cpus.append((time.process_time() - cpu) / calls * 1e6)

    try:
        anyio.run(drive)
    finally:
        store.close()
    return cpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if args.store == "sqlite":
        cpus = measure(
            f"sqlite:///{tempfile.mkdtemp(prefix='writ-pipeline-')}/writ.db", args.calls, args.rounds
        )
    else:
        import sqlalchemy as sa

        schema = f"writ_bench_{uuid.uuid4().hex[:10]}"
        engine = sa.create_engine(POSTGRES_URL.replace("postgresql://", "postgresql+psycopg://", 1))
        with engine.begin() as conn:
            conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
        try:
            cpus = measure(f"{POSTGRES_URL}?options=-csearch_path%3D{schema}", args.calls, args.rounds)
        finally:
            with engine.begin() as conn:
                conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
            engine.dispose()
    print(
        f"{args.store}: CPU per read {statistics.median(cpus):.0f} µs (median of {len(cpus)} rounds of "
        f"{args.calls}: {', '.join(f'{c:.0f}' for c in cpus)}); load {os.getloadavg()[0]:.2f}"
    )


if __name__ == "__main__":
    main()
