"""Gateway CPU per call from source trees, stores and the bare proxy, interleaved under the same load.

    python bench/interleaved.py [--before DIR --after DIR] [--stores sqlite,postgres] [--op read|write]
        [--rounds 6] [--block 50] [--clients N]

One backend and one upstream MCP server (the issue 16 scenario); in front of it the bare proxy and one
`writ serve` per tree and store (each with a store of its own), all started at once. Without --before
and --after the one tree is this checkout: the run then measures the read aims (Writ against the bare
proxy, PostgreSQL against SQLite) with each target seeing the same moments of the machine. `--op
write` sends refunds instead, each with a key and a reason of its own (the write aim).

Sequential agent-style calls go to each in turn, a block at a time (the order reversed every round), so
that all of them see the same load. On this VM that matters more than anything a change does: the same
fixed work costs up to twice the CPU from one 5-second window to the next (bench/README.md), which is
as long as one of `run.py`'s rows. CPU per call is the server process's user+system time
(`/proc/PID/stat`) over its blocks; beside the ratio of the totals, each target's ratio to the bare
proxy is taken in every round and the median of those given. Nothing is asserted.

`--clients N` measures instead how each target scales (the aim: Writ with 8 clients at least 1.3x its
own sequential calls/s): in every round each target gets a block from one client and a block of the
same size shared by N clients, which of the two first alternating, and the ratio of their calls/s is
taken round by round. Two rows of `run.py`, a minute apart, can differ by the machine's noise alone.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import load, processes  # noqa: E402
from bench.load import cpu_s  # noqa: E402

MODERN = "2026-07-28"


@dataclass
class Target:
    url: str
    token: str
    pid: int
    writ: bool
    cpu_s: float = 0.0
    wall_s: float = 0.0
    calls: int = 0
    blocks: list[float] = field(default_factory=list)

    def cpu_ms(self) -> float:
        return 1000 * self.cpu_s / self.calls

    def calls_per_s(self) -> float:
        return self.calls / self.wall_s

    def cpu_vs(self, yardstick: Target) -> float:
        """Its CPU per call against the yardstick's: the median over rounds of the two blocks of each."""
        return median_ratio(self.blocks, yardstick.blocks)

    def calls_vs(self, yardstick: Target) -> float:
        """Its calls/s against the yardstick's, over all its blocks."""
        return self.calls_per_s() / yardstick.calls_per_s()

    def session(self, op: str) -> load.Session:
        """Its MCP client (2026-07-28) making `op` calls as an agent does, each one its own."""
        return load.through_writ(
            self.url, self.token, op, MODERN, writ=self.writ, agent_reads=True, agent_writes=True
        )


async def drive(targets: dict[str, Target], op: str, rounds: int, block: int, warmup: int = 40) -> None:
    async with contextlib.AsyncExitStack() as stack:
        calls = {}
        for name, t in targets.items():
            calls[name] = await stack.enter_async_context(t.session(op)())
            for i in range(warmup):
                await calls[name](-1 - i)
        index = 0
        for r in range(rounds):
            for name in list(targets) if r % 2 == 0 else list(reversed(targets)):
                t = targets[name]
                cpu0, wall0 = cpu_s(t.pid), time.perf_counter()
                for _ in range(block):
                    index += 1
                    await calls[name](index)
                spent = cpu_s(t.pid) - cpu0
                t.cpu_s += spent
                t.wall_s += time.perf_counter() - wall0
                t.calls += block
                t.blocks.append(1000 * spent / block)


@dataclass
class Scaling:
    """One target's calls/s from one client and from several, a block of each in every round."""

    clients: int
    sequential: list[float] = field(default_factory=list)
    concurrent: list[float] = field(default_factory=list)

    def ratio(self) -> float:
        """The median over rounds of its calls/s with `clients` clients against one client's."""
        return median_ratio(self.concurrent, self.sequential)


async def scale(
    targets: dict[str, Target], op: str, rounds: int, block: int, clients: int, warmup: int = 40
) -> dict[str, Scaling]:
    """Each round, each target a block of `block` calls from one client and one from `clients` clients
    (`load.measure`: each client's session opened, and warmed up, before the clock starts)."""
    scaling = {name: Scaling(clients) for name in targets}
    sessions = {name: t.session(op) for name, t in targets.items()}
    for session in sessions.values():  # each process's first calls do lazy work: not in a round
        await load.measure(session, calls=warmup, concurrency=1, warmup=0)
    for r in range(rounds):
        for name in list(targets) if r % 2 == 0 else list(reversed(targets)):
            for n in (1, clients) if r % 2 == 0 else (clients, 1):
                measured = await load.measure(sessions[name], calls=block, concurrency=n, warmup=n)
                rates = scaling[name].sequential if n == 1 else scaling[name].concurrent
                rates.append(block / measured.wall_s)
    return scaling


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", help="a source tree (e.g. git archive main | tar -x)")
    parser.add_argument("--after", help="another source tree, measured beside --before")
    parser.add_argument("--stores", "--store", default="sqlite", help="comma-separated: sqlite,postgres")
    parser.add_argument("--op", choices=["read", "write"], default="read")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--block", type=int, default=50, help="calls per block")
    parser.add_argument(
        "--clients",
        type=int,
        default=1,
        help="N > 1: how each target scales from one client to N, instead of its CPU against the bare proxy",
    )
    args = parser.parse_args(argv)
    if args.clients < 1:
        parser.error("--clients takes 1 (CPU against the bare proxy) or more (how each target scales)")
    if args.block < args.clients:
        parser.error(f"--block {args.block} cannot give each of --clients {args.clients} a call")
    if (args.before is None) != (args.after is None):
        parser.error("--before and --after go together (without them, this checkout is measured)")
    trees = {"before": args.before, "after": args.after} if args.before else {"": str(processes.REPO)}
    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    if not stores or set(stores) - {"sqlite", "postgres"}:
        parser.error("--stores takes sqlite, postgres or both")
    out = Path(tempfile.mkdtemp(prefix="writ-interleaved-"))
    with contextlib.ExitStack() as stack:
        backend = stack.enter_context(processes.backend(out / "backend"))
        upstream = stack.enter_context(processes.bare_proxy(out / "upstream", backend.url))
        proxy = stack.enter_context(processes.bare_proxy(out / "bare", upstream_mcp=upstream.mcp_url))
        targets = {"bare proxy": Target(proxy.mcp_url, "none", proxy.pid, writ=False)}
        for label, tree in trees.items():
            processes.use_tree(Path(tree))
            for store in stores:
                name = " ".join(filter(None, (label, store if len(stores) > 1 or not label else "")))
                here = out / name.replace(" ", "-")
                url = stack.enter_context(processes.store_url(store, here))
                gw = stack.enter_context(
                    processes.gateway(here, backend.url, url, upstream_mcp=upstream.mcp_url)
                )
                targets[name] = Target(gw.mcp_url, gw.token(), gw.pid, writ=True)
        start = os.getloadavg()[0]
        if args.clients > 1:
            scaling = anyio.run(scale, targets, args.op, args.rounds, args.block, args.clients)
        else:
            anyio.run(drive, targets, args.op, args.rounds, args.block)
        end = os.getloadavg()[0]
    if args.clients > 1:
        _report_scaling(scaling, stores, args, start, end)
        return
    bare = targets["bare proxy"]
    print(
        f"{','.join(stores)}: {args.rounds} rounds of {args.block} sequential {args.op}s each, "
        f"load {start:.1f} -> {end:.1f}"
    )
    for name, t in targets.items():
        print(
            f"  {name:10s} CPU {t.cpu_ms():6.2f} ms/call (median block {statistics.median(t.blocks):.2f}), "
            f"{t.calls_per_s():6.1f} calls/s; vs bare proxy: CPU {t.cpu_ms() / bare.cpu_ms():.2f}x "
            f"(median of rounds {t.cpu_vs(bare):.2f}x, range {min_max(t.blocks, bare.blocks)}), "
            f"calls/s {t.calls_vs(bare):.2f}x"
        )
    if "sqlite" in targets and "postgres" in targets:
        sqlite, postgres = targets["sqlite"], targets["postgres"]
        print(
            f"  postgres against sqlite: CPU {postgres.cpu_ms() / sqlite.cpu_ms():.2f}x "
            f"(median of rounds {postgres.cpu_vs(sqlite):.2f}x), "
            f"SQLite's calls/s {sqlite.calls_vs(postgres):.2f}x PostgreSQL's"
        )


def _report_scaling(
    scaling: dict[str, Scaling], stores: list[str], args: argparse.Namespace, start: float, end: float
) -> None:
    print(
        f"{','.join(stores)}: {args.rounds} rounds, each a block of {args.block} {args.op}s from one client "
        f"and one shared by {args.clients} clients, load {start:.1f} -> {end:.1f}"
    )
    for name, s in scaling.items():
        print(
            f"  {name:10s} 1 client {statistics.median(s.sequential):6.1f} calls/s, "
            f"{args.clients} clients {statistics.median(s.concurrent):6.1f} calls/s (medians of blocks): "
            f"{s.ratio():.2f}x (median of rounds, range {min_max(s.concurrent, s.sequential)})"
        )
    print(f"  aim: Writ with 8 clients at least 1.3x its own sequential calls/s (here: {args.clients})")


def _round_ratios(blocks: list[float], yardstick: list[float]) -> list[float]:
    return [b / y for b, y in zip(blocks, yardstick, strict=True) if y > 0]


def median_ratio(blocks: list[float], yardstick: list[float]) -> float:
    """The median over rounds of one target's CPU per call against another's in the same round; NaN
    where no round of the yardstick lasted a clock tick of CPU (blocks of a few calls)."""
    ratios = _round_ratios(blocks, yardstick)
    return statistics.median(ratios) if ratios else math.nan


def min_max(blocks: list[float], yardstick: list[float]) -> str:
    ratios = _round_ratios(blocks, yardstick)
    return f"{min(ratios):.2f} to {max(ratios):.2f}" if ratios else "-"


if __name__ == "__main__":
    main()
