"""Instructions per write of the store alone, counted by callgrind: what the machine's load does not move.

    python bench/write_instructions.py [--store sqlite|postgres] [--op write|read] [--writes 300] [--tree DIR]

Runs the hot write path of `bench/store_writes.py` (one `Store.admit` of an allowed call, one
`Store.record_outcome`; with `--op read`, a read's `Store.admissible_read` and `Store.record_read`)
twice under `valgrind --tool=callgrind`, with no measured writes and with
`--writes`, and prints the difference per write: the instructions of this process (its writer
included; PostgreSQL's server is another process, not counted). The writer runs each write on the
calling thread, as the group writer's lone write does on its own, so no thread hand-off is counted.
Each run migrates a fresh store and makes 50 unmeasured writes first. `--tree DIR` imports the store
from another source tree (`git archive <commit> | tar -x -C DIR`); compile it first
(`python -m compileall -q DIR`), or the first run counts the compilation too. About a minute a run.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import Connection

HERE = Path(__file__).resolve().parents[1]
POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
WARM = 50


def write(tree: Path, store: str, writes: int, op: str = "write") -> None:
    """Migrate a fresh store, make `WARM` writes (or reads: `op`), then `writes` more (under callgrind)."""
    sys.path.insert(0, str(HERE))  # tests.store.builders, from this tree
    sys.path.insert(0, str(tree))
    from store import Store
    from store.batching import GroupWriter, _Job
    from tests.store.builders import call_request, new_id, outcome

    def inline(
        writer: GroupWriter,
        work: Callable[[Connection], object],
        *,
        retry: bool = False,
        heads: frozenset[str] = frozenset(),
    ) -> object:
        job: _Job[object] = _Job(work, retry, heads)
        writer._alone(job)
        return job.future.result()

    def writes_of(store: Store, count: int) -> None:
        for req in [call_request(idempotency_key=new_id("key")) for _ in range(count)]:
            token = store.admit(req).call.lease_token
            store.record_outcome(
                outcome(req.identity.tool_call_id, "completed", token=token, now=req.identity.now)
            )

    def reads_of(store: Store, count: int) -> None:
        from tests.store.test_read_records import answered, read_request

        for n in range(count):
            req = read_request(n)
            store.admissible_read(req)
            store.record_read(answered(req))

    def run(url: str) -> None:
        with Store.open(url) as opened:
            opened.migrate()
            writer = opened.writer
            writer.run = lambda work, **kw: inline(writer, work, **kw)  # type: ignore[method-assign,assignment]
            (reads_of if op == "read" else writes_of)(opened, WARM + writes)

    if store == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            run(f"sqlite:///{tmp}/writ.db")
    else:
        from tests.postgres import fresh_schema

        with fresh_schema(POSTGRES_URL) as url:
            run(url)


def counted(tree: Path, store: str, writes: int, op: str = "write") -> int:
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={tmp}/callgrind.out",
                sys.executable,
                __file__,
                "--child",
                "--store",
                store,
                "--writes",
                str(writes),
                "--tree",
                str(tree),
                "--op",
                op,
            ],
            capture_output=True,
            text=True,
            check=True,
        )
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise SystemExit(f"no instruction count in callgrind's output:\n{done.stderr}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--store", choices=["sqlite", "postgres"], default="postgres")
    parser.add_argument("--writes", type=int, default=300)
    parser.add_argument(
        "--op", choices=["write", "read"], default="write", help="a write (admit, outcome) or a recorded read"
    )
    parser.add_argument("--tree", type=Path, default=HERE, help="import store/ from this source tree")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    tree = args.tree.resolve()
    if args.child:
        write(tree, args.store, args.writes, args.op)
        return
    base = counted(tree, args.store, 0, args.op)
    total = counted(tree, args.store, args.writes, args.op)
    print(f"{tree}  {args.store}: {(total - base) / args.writes / 1e6:.3f} M instructions per {args.op}")


if __name__ == "__main__":
    main()
