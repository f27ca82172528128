"""What an idle gateway costs: CPU per second of `writ serve` serving no calls, beside the bare proxy.

    python bench/idle.py [--stores sqlite,postgres] [--trees DIR,DIR] [--rounds 3] [--seconds 30]

Each round starts, all at once, one acme-payments backend, the bare MCP proxy in front of it
(`bench/bare_proxy.py`, the yardstick) and one `writ serve` on the demo config per store and source
tree (each with a fresh store: a SQLite file or a PostgreSQL schema of its own), waits `--settle`
seconds (10) for them to finish starting, then reads every process's user+system CPU (`/proc/PID/stat`)
over the same `--seconds` and prints it in ms per second. Sampling every process over the same window
puts them under the same load, which on a shared machine moves more than idle processes themselves
do; each round starts them anew. `--trees` runs the gateways from other source trees (e.g. `git
archive <commit> | tar -x -C DIR`) to set a commit before a change against one after it; without
it, this checkout's. The clock tick is 10 ms: over 30 s, figures move in steps of 0.33 ms/s.
Nothing is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import processes  # noqa: E402
from bench.load import cpu_s  # noqa: E402


def one_round(
    out: Path, stores: list[str], trees: list[Path], settle_s: float, seconds: float
) -> dict[str, float]:
    """Start every process, let them settle, and return each one's CPU in ms per second over `seconds`."""
    with contextlib.ExitStack() as stack:
        backend = stack.enter_context(processes.backend(out / "backend"))
        proxy = stack.enter_context(processes.bare_proxy(out / "bare", backend.url))
        pids = {"bare proxy": proxy.pid}
        for store in stores:
            for number, tree in enumerate(trees):
                processes.use_tree(tree)
                name = f"{store} {tree.name if len(trees) > 1 else 'writ'}"
                workdir = out / f"{store}-{number}"
                url = stack.enter_context(processes.store_url(store, workdir))
                pids[name] = stack.enter_context(processes.gateway(workdir, backend.url, url)).pid
        time.sleep(settle_s)
        before = {name: cpu_s(pid) for name, pid in pids.items()}
        started = time.monotonic()
        time.sleep(seconds)
        after = {name: cpu_s(pid) for name, pid in pids.items()}
        wall = time.monotonic() - started
    return {name: 1000 * (after[name] - before[name]) / wall for name in pids}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stores", default="sqlite,postgres", help="comma-separated: sqlite, postgres")
    parser.add_argument("--trees", default="", help="comma-separated source trees (default: this checkout)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settle", type=float, default=10.0, help="seconds between start and sampling")
    parser.add_argument("--seconds", type=float, default=30.0, help="seconds sampled per round")
    args = parser.parse_args()
    stores = [s for s in args.stores.split(",") if s]
    trees = [Path(t).resolve() for t in args.trees.split(",") if t] or [processes.REPO]
    out = Path(tempfile.mkdtemp(prefix="writ-idle-"))
    rows: dict[str, list[float]] = {}
    for number in range(args.rounds):
        load = os.getloadavg()[0]
        figures = one_round(out / f"round-{number}", stores, trees, args.settle, args.seconds)
        shown = ", ".join(f"{name} {ms:.2f}" for name, ms in figures.items())
        end = os.getloadavg()[0]
        print(f"round {number + 1}: load {load:.2f} -> {end:.2f}; CPU ms/s: {shown}", flush=True)
        for name, ms in figures.items():
            rows.setdefault(name, []).append(ms)
    print(f"idle CPU over {args.rounds} rounds of {args.seconds:.0f} s (ms per second: median, min-max)")
    for name, values in rows.items():
        print(f"  {name:24s} {statistics.median(values):6.2f}  ({min(values):.2f}-{max(values):.2f})")


if __name__ == "__main__":
    main()
