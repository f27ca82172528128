"""Closed-loop load: W workers, each with its own reused client, make N calls in total as fast as answered.

Sessions are opened and warmed up before the clock starts; each worker then takes the next call index
until N calls are done. Latency is per call, measured in the worker; throughput is N over the wall time.
CPU seconds of the client (this process) and of the measured server processes are taken over the same
window, because on a 2-core box the load generator competes with what it measures.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import RequestParamsMeta

Call = Callable[[int], Awaitable[None]]
"""One call with a given global index; raises when the answer is not the expected success."""
Session = Callable[[], contextlib.AbstractAsyncContextManager[Call]]
"""Opens one worker's client (a persistent connection or an MCP session) and yields its `Call`."""

ORDERS = (("1002", "EUR"), ("1003", "USD"))
"""The two orders with the most refundable money; every write refunds 0.01 from one of them."""


class BadAnswer(Exception):
    """A call returned something other than the expected success."""


@dataclass(frozen=True)
class Measurement:
    calls: int
    concurrency: int
    wall_s: float
    latencies_s: tuple[float, ...]
    client_cpu_s: float
    server_cpu_s: float | None
    store: Mapping[str, int | None] = field(default_factory=dict)
    """What a `Probe` read over the window: store bytes grown, fsyncs (see bench.probes)."""

    @property
    def calls_per_s(self) -> float:
        return self.calls / self.wall_s

    def percentile_ms(self, p: float) -> float:
        ordered = sorted(self.latencies_s)
        return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)] * 1000

    def client_cpu_ms_per_call(self) -> float:
        return self.client_cpu_s / self.calls * 1000

    def server_cpu_ms_per_call(self) -> float | None:
        return None if self.server_cpu_s is None else self.server_cpu_s / self.calls * 1000

    def per_call(self, name: str) -> float | None:
        """A probe's figure divided by the calls, or None where it was not measured."""
        value = self.store.get(name)
        return None if value is None else value / self.calls


class Probe(Protocol):
    """Read at the edges of the measured window (bench.probes.StoreProbe)."""

    def start(self) -> None: ...

    def stop(self) -> dict[str, int | None]: ...


def cpu_s(pid: int) -> float:
    """The process's user + system CPU so far, in seconds (Linux /proc).

    Raises:
        OSError: no such process, or no /proc.
    """
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _process_cpu_s(pids: Sequence[int]) -> float | None:
    """User + system CPU seconds of these processes (Linux /proc), None where unavailable."""
    try:
        return sum(cpu_s(pid) for pid in pids)
    except OSError:
        return None


async def measure(
    session: Session,
    *,
    calls: int,
    concurrency: int,
    warmup: int,
    server_pids: Sequence[int] = (),
    probe: Probe | None = None,
) -> Measurement:
    """Open `concurrency` sessions, warm each up, then make `calls` calls between them."""
    next_index = 0
    latencies: list[float] = []
    opened = finished = 0
    all_open, go, all_done = anyio.Event(), anyio.Event(), anyio.Event()
    clock: dict[str, float] = {}
    store: dict[str, int | None] = {}

    async def worker() -> None:
        nonlocal next_index, opened, finished
        # Each worker enters and leaves its own client in its own task (the MCP client's task
        # groups require it), and leaves only after the clock has stopped.
        async with session() as call:
            for i in range(max(1, warmup // concurrency)):
                await call(-1 - i)
            opened += 1
            if opened == concurrency:
                all_open.set()
            await go.wait()
            while next_index < calls:
                index = next_index
                next_index += 1
                started = time.perf_counter()
                await call(index)
                latencies.append(time.perf_counter() - started)
            finished += 1
            if finished == concurrency:
                clock["end"] = time.perf_counter()
                clock["cpu"] = time.process_time()
                clock["server"] = _process_cpu_s(server_pids) or -1.0
                if probe is not None:
                    store.update(probe.stop())
                all_done.set()
            await all_done.wait()

    async with anyio.create_task_group() as tg:
        for _ in range(concurrency):
            tg.start_soon(worker)
        await all_open.wait()
        if probe is not None:
            probe.start()
        cpu0, server0 = time.process_time(), _process_cpu_s(server_pids)
        clock["start"] = time.perf_counter()
        go.set()
    server = None if server0 is None or clock["server"] < 0 else clock["server"] - server0
    wall = clock["end"] - clock["start"]
    return Measurement(calls, concurrency, wall, tuple(latencies), clock["cpu"] - cpu0, server, store)


def _refund(index: int, *, distinct: bool = False) -> dict[str, Any]:
    order, currency = ORDERS[index % len(ORDERS)]
    reason = f"benchmark {index}-{uuid.uuid4().hex[:8]}" if distinct else "benchmark"
    return {"order_id": order, "amount": 0.01, "currency": currency, "reason": reason}


def _key(tag: str, index: int) -> str:
    return f"bench-{tag}-{index}-{uuid.uuid4().hex[:12]}"


def direct(base_url: str, op: str) -> Session:
    """The backend over HTTP, one persistent httpx2 connection per worker."""

    @contextlib.asynccontextmanager
    async def session() -> AsyncIterator[Call]:
        async with httpx2.AsyncClient(base_url=base_url, timeout=30) as http:

            async def read(index: int) -> None:
                response = await http.get(f"/orders/{ORDERS[index % len(ORDERS)][0]}")
                if response.status_code != 200:
                    raise BadAnswer(f"GET /orders: {response.status_code} {response.text[:200]}")

            async def write(index: int) -> None:
                response = await http.post(
                    "/refunds", json=_refund(index), headers={"Idempotency-Key": _key("direct", index)}
                )
                if response.status_code != 201:
                    raise BadAnswer(f"POST /refunds: {response.status_code} {response.text[:200]}")

            yield read if op == "read" else write

    return session


def through_writ(
    mcp_url: str,
    token: str,
    op: str,
    mode: str,
    *,
    repeat_reads: bool = False,
    writ: bool = True,
    agent_reads: bool = False,
    agent_writes: bool = False,
) -> Session:
    """Writ with the official MCP client, one client session per worker, reused for every call.

    Every call carries its own idempotency key, so each is a new call that reaches the backend and is
    admitted before it runs (two commits, as a write). `repeat_reads` sends reads without a key, cycling
    over a few orders: a read has no dedupe window, so each runs and is recorded in one commit, and
    joins another only while an identical one is in flight. `writ=False` points the same client at the
    bare proxy, whose results carry no Writ status.

    `agent_reads` sends reads as an agent does: without a key (so Writ records each in one commit),
    each with arguments of its own (`request`: its index), so that no two are joined in flight.
    `agent_writes` gives each refund a `reason` of its own, so that no two are one action to the demo's
    loop rules (its near-identical refund rule leaves reason and amount out: `bench.processes` sets
    thresholds no run reaches where the rules are on).
    """
    check = _check if writ else _check_bare

    @contextlib.asynccontextmanager
    async def session() -> AsyncIterator[Call]:
        async with (
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30) as http,
            Client(streamable_http_client(mcp_url, http_client=http), mode=mode) as client,
        ):

            async def read(index: int) -> None:
                meta = (
                    None
                    if repeat_reads or agent_reads
                    else cast(RequestParamsMeta, {"writ/idempotencyKey": _key("read", index)})
                )
                arguments: dict[str, Any] = {"order_id": ORDERS[index % len(ORDERS)][0]}
                if agent_reads:
                    arguments["request"] = f"{index}-{uuid.uuid4().hex[:8]}"
                check(await client.call_tool("lookup_order", arguments, meta=meta))

            async def write(index: int) -> None:
                result = await client.call_tool(
                    "refund_order",
                    _refund(index, distinct=agent_writes),
                    meta=cast(RequestParamsMeta, {"writ/idempotencyKey": _key("writ", index)}),
                )
                check(result)

            yield read if op == "read" else write

    return session


def spread(sessions: Sequence[Session]) -> Session:
    """Workers opened in turn over several sessions (replicas of one gateway): the first worker's
    client goes to the first, the next to the second, and so on round the list."""
    opened = 0

    def session() -> contextlib.AbstractAsyncContextManager[Call]:
        nonlocal opened
        opened += 1
        return sessions[(opened - 1) % len(sessions)]()

    return session


def _check(result: Any) -> None:
    status = (result.meta or {}).get("writ/status")
    if result.is_error or status != "completed":
        # What Writ said, so that a run that stops on it says why (its reason is in the text).
        said = " ".join(getattr(part, "text", "") for part in result.content or ())[:500]
        raise BadAnswer(f"tool call not completed: status={status!r} is_error={result.is_error}: {said}")


def _check_bare(result: Any) -> None:
    if result.is_error:
        raise BadAnswer(f"bare proxy call failed: {result.content}")
