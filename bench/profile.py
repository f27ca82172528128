"""Profile the gateway under a sequential load with py-spy (not a project dependency: `pip install py-spy`).

    python bench/profile.py --op read|write [--store sqlite|postgres] [--seconds 15] [--out DIR]

Starts a fresh backend, store and gateway, drives one MCP client (2026-07-28) in a loop, samples the
gateway process with `py-spy record --format raw` (collapsed stacks, threads included, idle excluded) and
prints the functions with the most inclusive and self samples. The raw file can be opened in speedscope.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import subprocess
import sys
import tempfile
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import load, processes  # noqa: E402


def summarize(raw: Path, top: int) -> str:
    inclusive: collections.Counter[str] = collections.Counter()
    self_: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = [
            f.split(" (")[0] + " " + f.split(" (")[1].split(":")[0].rsplit("/", 1)[-1] if " (" in f else f
            for f in stack.split(";")
        ]
        total += count
        for frame in set(frames):
            inclusive[frame] += count
        self_[frames[-1]] += count
    lines = [f"{total} samples", "", "inclusive:"]
    lines += [f"  {100 * n / total:5.1f}%  {name}" for name, n in inclusive.most_common(top)]
    lines += ["", "self:"]
    lines += [f"  {100 * n / total:5.1f}%  {name}" for name, n in self_.most_common(top)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--op", choices=["read", "write"], default="read")
    parser.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=45)
    parser.add_argument("--tree", help="run the gateway from this source tree")
    parser.add_argument("--sse", action="store_true", help="json_response: false (SSE answers)")
    parser.add_argument(
        "--gil", action="store_true", help="sample only the thread holding the GIL (Python CPU, no waits)"
    )
    parser.add_argument(
        "--upstream-mcp",
        action="store_true",
        help="tools from an upstream MCP server (issue 16)",
    )
    parser.add_argument("--out", default=None, help="directory for the raw profile (default: a temp dir)")
    args = parser.parse_args()
    if args.tree:
        processes.use_tree(Path(args.tree))
    out = Path(args.out or tempfile.mkdtemp(prefix="writ-profile-"))
    out.mkdir(parents=True, exist_ok=True)
    raw = out / f"{args.op}-{args.store}.txt"
    json_response = False if args.sse else None
    with (
        processes.backend(out / "backend") as backend,
        contextlib.ExitStack() as stack,
        processes.store_url(args.store, out) as url,
    ):
        upstream = None
        if args.upstream_mcp:
            upstream = stack.enter_context(processes.bare_proxy(out / "upstream", backend.url)).mcp_url
        gateway = stack.enter_context(
            processes.gateway(
                out / "gateway", backend.url, url, json_response=json_response, upstream_mcp=upstream
            )
        )
        agent = upstream is not None
        session = load.through_writ(
            gateway.mcp_url, gateway.token(), args.op, "2026-07-28", agent_reads=agent, agent_writes=agent
        )

        async def drive() -> int:
            async with session() as call:
                for i in range(50):
                    await call(-1 - i)
                spy = subprocess.Popen(
                    [
                        "py-spy",
                        "record",
                        "--pid",
                        str(gateway.pid),
                        "--format",
                        "raw",
                        "--rate",
                        str(args.rate),
                        "--duration",
                        str(int(args.seconds)),
                        "--threads",
                        "--output",
                        str(raw),
                        "--nonblocking",
                        *(["--gil"] if args.gil else []),
                    ],
                    stdout=subprocess.DEVNULL,
                )
                n = 0
                while spy.poll() is None:
                    await call(n)
                    n += 1
                return n

        calls = anyio.run(drive)
    print(f"{calls} calls in ~{args.seconds:.0f}s; raw profile: {raw}")
    print(summarize(raw, args.top))


if __name__ == "__main__":
    main()
