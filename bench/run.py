"""Writ's benchmark: calls/s and p50/p99 latency of a read and a write, direct and through Writ.

    python bench/run.py [--calls N] [--concurrency 8,32] [--stores sqlite,postgres] [--out FILE]

Direct: the acme-payments backend over HTTP (one persistent httpx2 connection per worker). Through
Writ: `writ serve` on the demo config (auth on, events durable), the official MCP client with one
reused session per worker, on each store. Sequential (1 worker) and concurrent (N workers). Every
scenario gets a fresh backend, store and gateway (unless --reuse-processes), and is warmed up before
the clock starts.

The MCP scenario (issue 16) puts an upstream MCP server in front of acme-payments and measures the
official client against it directly (MCP-direct), through the bare MCP proxy and through Writ, and
each Writ row's calls/s and gateway CPU against the bare proxy's of the same run. With
`--policy-checks off,on` (issue 13), each of its Writ rows runs without and then with the demo's loop
rules and budgets, and the on/off ratios of calls/s and gateway CPU per call are printed per pair.
After each operation's rows, `--interleave` rounds (default 8) measure its sequential aims side by
side: the bare proxy and Writ on each store take turns, a block of calls each (`bench.interleaved`),
so that every target sees the same moments of the machine; their aim lines follow the rows' own.
The same turns then measure the 8-client aim (`--interleave-clients`, default 8): each target, every
round, a block from one client and a block from that many, the ratio of their calls/s taken round by
round (`interleaved.scale`).

Prints a markdown table and writes JSON. Nothing here asserts a speed: it reports what it measures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import interleaved, load, probes, processes  # noqa: E402

MODERN, LEGACY = "2026-07-28", "2025-11-25"
POLICY_CHECKS = "policy_checks"
"""The variant naming whether a Writ row ran with the demo's loop rules and budgets (`on`) or not."""
CLIENT_MODE = {MODERN: MODERN, LEGACY: "legacy"}


@dataclass
class Row:
    op: str  # read | write
    target: str  # direct | bare | writ
    store: str
    mode: str
    concurrency: int
    m: load.Measurement
    variant: dict[str, Any] = field(default_factory=dict)
    ratio: float | None = None
    upstream: str = "http"
    """What serves the tools: acme-payments over HTTP, or an MCP server in front of it (`mcp`)."""
    vs_bare: float | None = None
    """calls/s over the bare proxy's, same operation, mode, concurrency and upstream."""
    cpu_vs_bare: float | None = None
    """Server CPU per call over the bare proxy's."""
    on_vs_off: float | None = None
    """For a row with policy checks on: its calls/s over the same row's with them off."""
    cpu_on_vs_off: float | None = None
    """For a row with policy checks on: its gateway CPU per call over the same row's with them off."""
    loadavg: float = field(default_factory=lambda: os.getloadavg()[0])
    """The machine's 1-minute load average as the row was measured: each figure is read beside it."""
    replicas: int = 1
    """Writ processes sharing the row's store, its clients spread over them in turn."""

    @property
    def scenario(self) -> str:
        if self.upstream == "mcp":
            via = {"direct": "MCP-direct", "bare": "via bare MCP proxy -> MCP", "writ": "via Writ -> MCP"}
        else:
            via = {"direct": "direct", "bare": "via bare MCP proxy", "writ": "via Writ"}
        return f"{self.op} {via[self.target]}"

    @property
    def store_label(self) -> str:
        extras = [f"{k}={str(v).lower()}" for k, v in self.variant.items()]
        replicas = [f"{self.replicas} replicas"] if self.replicas > 1 else []
        return " ".join([self.store, *replicas, *extras])

    def to_json(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "target": self.target,
            "upstream": self.upstream,
            "store": self.store,
            "replicas": self.replicas,
            "mode": self.mode,
            "variant": self.variant,
            "concurrency": self.concurrency,
            "calls": self.m.calls,
            "wall_s": round(self.m.wall_s, 4),
            "calls_per_s": round(self.m.calls_per_s, 2),
            "p50_ms": round(self.m.percentile_ms(50), 3),
            "p99_ms": round(self.m.percentile_ms(99), 3),
            "ratio_vs_direct": None if self.ratio is None else round(self.ratio, 3),
            "ratio_vs_bare": _round(self.vs_bare),
            "cpu_vs_bare": _round(self.cpu_vs_bare),
            "client_cpu_s": round(self.m.client_cpu_s, 3),
            "server_cpu_ms_per_call": _round(self.m.server_cpu_ms_per_call()),
            # bench.probes: the gateway's own fsyncs (SQLite's), PostgreSQL's WAL syncs cluster-wide
            # (an upper bound on a shared server), and how much the store grew.
            "loadavg_1m": round(self.loadavg, 2),
            "fsyncs_per_call": _round(self.m.per_call("gateway_fsyncs")),
            "pg_wal_syncs_per_call": _round(self.m.per_call("server_wal_syncs")),
            "store_bytes_per_call": _round(self.m.per_call("store_bytes")),
            # Evidence that the policy checks ran: calls a budget counted, loop marks written.
            "budget_counted_per_call": _round(self.m.per_call("budget_calls")),
            "loop_marks_per_call": _round(self.m.per_call("loop_marks")),
            "on_vs_off_calls_per_s": _round(self.on_vs_off),
            "on_vs_off_cpu": _round(self.cpu_on_vs_off),
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


@dataclass(frozen=True)
class SideBySide:
    """One operation measured interleaved (`bench.interleaved`): the bare proxy and Writ on each store,
    a block of sequential calls each in turn, so that every target sees the same moments of the machine."""

    op: str
    rounds: int
    block: int
    targets: dict[str, interleaved.Target]
    """`bare proxy`, then one per store."""
    scaling: dict[str, interleaved.Scaling] | None = None
    """Each target's calls/s from one client and from `--interleave-clients`, round by round."""

    def cpu_vs_bare(self, name: str) -> float:
        return self.targets[name].cpu_vs(self.targets["bare proxy"])

    def calls_vs_bare(self, name: str) -> float:
        return self.targets[name].calls_vs(self.targets["bare proxy"])

    def to_json(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "rounds": self.rounds,
            "block": self.block,
            "targets": {
                name: {
                    "calls_per_s": round(t.calls_per_s(), 2),
                    "server_cpu_ms_per_call": round(t.cpu_ms(), 3),
                    "cpu_per_call_by_round_ms": [round(b, 3) for b in t.blocks],
                    "calls_per_s_vs_bare": round(self.calls_vs_bare(name), 3),
                    "cpu_vs_bare_median_of_rounds": round(self.cpu_vs_bare(name), 3),
                }
                for name, t in self.targets.items()
            },
            "scaling": None
            if self.scaling is None
            else {
                name: {
                    "clients": sc.clients,
                    "one_client_calls_per_s_by_round": [round(r, 2) for r in sc.sequential],
                    "clients_calls_per_s_by_round": [round(r, 2) for r in sc.concurrent],
                    "ratio_median_of_rounds": round(sc.ratio(), 3),
                }
                for name, sc in self.scaling.items()
            },
        }


class Bench:
    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.workdir = workdir
        self.rows: list[Row] = []
        self.side_by_side: list[SideBySide] = []
        self._n = 0
        self._reused: dict[tuple[Any, ...], Any] = {}

    def _dir(self, name: str) -> Path:
        self._n += 1
        return self.workdir / f"{self._n:02d}-{name}"

    def _measure(
        self,
        session: load.Session,
        concurrency: int,
        pids: list[int],
        gateway: processes.Gateway | None = None,
    ) -> load.Measurement:
        probe = None if gateway is None else probes.StoreProbe(gateway.store_url, gateway.fsync_trace)
        return anyio.run(
            lambda: load.measure(
                session,
                calls=self.args.calls,
                concurrency=concurrency,
                warmup=max(self.args.warmup, concurrency * 5),
                server_pids=pids,
                probe=probe,
            )
        )

    def _record(self, row: Row) -> None:
        self.rows.append(row)
        print(
            f"  {row.scenario:<15} {row.store_label:<28} {row.mode:<10} c={row.concurrency:<2} "
            f"{row.m.calls_per_s:8.1f} calls/s  p50 {row.m.percentile_ms(50):7.2f} ms  "
            f"p99 {row.m.percentile_ms(99):7.2f} ms  fsyncs/call {_fsyncs(row.m)}  "
            f"bytes/call {_num(row.m.per_call('store_bytes'), '.0f')}  load {row.loadavg:.1f}",
            file=sys.stderr,
            flush=True,
        )

    def _started(
        self,
        own: contextlib.ExitStack,
        shared: contextlib.ExitStack,
        key: tuple[Any, ...],
        start: Callable[[], Any],
    ) -> Any:
        """What `start()` enters (a process, a store) for one row: its own, closed with `own`; with
        --reuse-processes, the one every row of the scenario asking by the same `key` shares, closed
        with `shared`."""
        if not self.args.reuse_processes:
            return own.enter_context(start())
        if key not in self._reused:
            self._reused[key] = shared.enter_context(start())
        return self._reused[key]

    @contextlib.contextmanager
    def _scenario(self) -> Iterator[contextlib.ExitStack]:
        """The stack a scenario's shared processes (--reuse-processes) live in: stopped when it ends."""
        with contextlib.ExitStack() as shared:
            try:
                yield shared
            finally:
                self._reused.clear()

    def direct(self) -> None:
        with self._scenario() as shared:
            for op in ("read", "write"):
                for concurrency in self._concurrencies():
                    with contextlib.ExitStack() as own:
                        start = partial(processes.backend, self._dir(f"direct-{op}-{concurrency}"))
                        backend = self._started(own, shared, ("backend",), start)
                        m = self._measure(load.direct(backend.url, op), concurrency, [backend.pid])
                    self._record(Row(op, "direct", "-", "HTTP", concurrency, m))

    def bare(self) -> None:
        """The MCP SDK stack alone in front of the backend: what any gateway built on it starts from."""
        with self._scenario() as shared:
            for op, mode in (("read", MODERN), ("read", LEGACY), ("write", MODERN)):
                workdir = self._dir(f"bare-{op}")
                with contextlib.ExitStack() as own:
                    backend = self._started(
                        own, shared, ("backend",), partial(processes.backend, workdir / "backend")
                    )
                    proxy = self._started(
                        own, shared, ("proxy",), partial(processes.bare_proxy, workdir / "proxy", backend.url)
                    )
                    session = load.through_writ(proxy.mcp_url, "none", op, CLIENT_MODE[mode], writ=False)
                    m = self._measure(session, 1, [proxy.pid])
                self._record(Row(op, "bare", "-", mode, 1, m))

    def writ(
        self,
        store: str,
        plan: list[tuple[str, str, int]],
        *,
        durable: bool = True,
        json_response: bool | None = None,
        repeat_reads: bool = False,
    ) -> None:
        variant: dict[str, Any] = {}
        if not durable:
            variant["durable"] = False
        if json_response is not None:
            variant["json_response"] = json_response
        if repeat_reads:
            variant["repeated_args_joined"] = True
        reuse = self.args.reuse_processes
        with contextlib.ExitStack() as shared:
            started: tuple[processes.Gateway, str] | None = None
            for op, mode, concurrency in plan:
                with contextlib.ExitStack() as own:
                    if started is None or not reuse:
                        workdir = self._dir(f"writ-{store}-{op}-{concurrency}")
                        stack = shared if reuse else own
                        backend = stack.enter_context(processes.backend(workdir / "backend"))
                        url = stack.enter_context(processes.store_url(store, workdir))
                        gateway = stack.enter_context(
                            processes.gateway(
                                workdir / "gateway",
                                backend.url,
                                url,
                                durable=durable,
                                json_response=json_response,
                                trace_fsyncs=True,
                            )
                        )
                        started = gateway, gateway.token()
                    gateway, token = started
                    session = load.through_writ(
                        gateway.mcp_url, token, op, CLIENT_MODE[mode], repeat_reads=repeat_reads
                    )
                    m = self._measure(session, concurrency, [gateway.pid], gateway)
                self._record(Row(op, "writ", store, mode, concurrency, m, variant))

    def mcp(self) -> None:
        """MCP client -> (nothing, the bare proxy, Writ on each store) -> an upstream MCP server.

        The upstream is `bench.bare_proxy` over acme-payments, one per operation, shared by its rows;
        each row gets a fresh proxy or gateway (and store), unless --reuse-processes (then one upstream,
        one bare proxy, one gateway per store and policy-checks setting, and one set of replicas whose
        first is the PostgreSQL one, serve every row of the scenario, both operations). Reads are sent
        as an agent sends them: no idempotency key, arguments of their own; so are writes (a key each,
        a `reason` of their own).
        Each Writ row is run once per `--policy-checks` setting, off then on.
        """
        with self._scenario() as shared:
            for op in self.args.ops:
                workdir = self._dir(f"mcp-{op}")
                with contextlib.ExitStack() as per_op:
                    backend = self._started(
                        per_op, shared, ("backend",), partial(processes.backend, workdir / "backend")
                    )
                    upstream = self._started(
                        per_op,
                        shared,
                        ("upstream",),
                        partial(processes.bare_proxy, workdir / "upstream", backend.url),
                    )
                    for concurrency in self._concurrencies():
                        self._mcp_rows(op, concurrency, workdir, backend, upstream, shared)
                        if concurrency > 1 and "postgres" in self.args.stores and self.args.replicas > 1:
                            self._replicas(op, concurrency, workdir, backend.url, upstream.mcp_url, shared)
                    if self.args.interleave:
                        self._interleaved(op, workdir, backend, upstream, shared)

    def _mcp_rows(
        self,
        op: str,
        concurrency: int,
        workdir: Path,
        backend: processes.Backend,
        upstream: processes.BareProxy,
        shared: contextlib.ExitStack,
    ) -> None:
        """The MCP scenario's rows of one operation and concurrency: direct, bare, then Writ's."""
        session = load.through_writ(upstream.mcp_url, "none", op, MODERN, writ=False, agent_reads=True)
        m = self._measure(session, concurrency, [upstream.pid])
        self._record(Row(op, "direct", "-", MODERN, concurrency, m, upstream="mcp"))
        with contextlib.ExitStack() as own:
            bare = partial(
                processes.bare_proxy, workdir / f"bare-{concurrency}", upstream_mcp=upstream.mcp_url
            )
            proxy = self._started(own, shared, ("bare",), bare)
            session = load.through_writ(proxy.mcp_url, "none", op, MODERN, writ=False, agent_reads=True)
            m = self._measure(session, concurrency, [proxy.pid])
        self._record(Row(op, "bare", "-", MODERN, concurrency, m, upstream="mcp"))
        for store in self.args.stores:
            for checks in self.args.policy_checks:
                here = workdir / f"writ-{store}-{concurrency}{'-checks' if checks else ''}"
                with contextlib.ExitStack() as own:
                    start = partial(self._mcp_gateway, here, backend.url, upstream.mcp_url, store, checks)
                    gw, token = self._started(own, shared, ("writ", store, checks), start)
                    session = load.through_writ(
                        gw.mcp_url, token, op, MODERN, agent_reads=True, agent_writes=True
                    )
                    m = self._measure(session, concurrency, [gw.pid], gw)
                variant = self._checks_variant(checks)
                self._record(Row(op, "writ", store, MODERN, concurrency, m, variant, upstream="mcp"))

    def _interleaved(
        self,
        op: str,
        workdir: Path,
        backend: processes.Backend,
        upstream: processes.BareProxy,
        shared: contextlib.ExitStack,
    ) -> None:
        """The operation's aims measured side by side (`--interleave` rounds): the bare proxy and Writ
        on each store (policy checks off), in a process each (with --reuse-processes, the rows' own)."""
        rounds, block = self.args.interleave, self.args.interleave_block
        with contextlib.ExitStack() as own:
            bare = partial(processes.bare_proxy, workdir / "bare-interleaved", upstream_mcp=upstream.mcp_url)
            proxy = self._started(own, shared, ("bare",), bare)
            targets = {"bare proxy": interleaved.Target(proxy.mcp_url, "none", proxy.pid, writ=False)}
            for store in self.args.stores:
                here = workdir / f"writ-{store}-interleaved"
                start = partial(self._mcp_gateway, here, backend.url, upstream.mcp_url, store, False)
                gw, token = self._started(own, shared, ("writ", store, False), start)
                targets[store] = interleaved.Target(gw.mcp_url, token, gw.pid, writ=True)
            anyio.run(interleaved.drive, targets, op, rounds, block, self.args.warmup)
            clients = self.args.interleave_clients
            scaling = None
            if clients > 1:
                scaling = anyio.run(interleaved.scale, targets, op, rounds, block, clients, self.args.warmup)
        measured = SideBySide(op, rounds, block, targets, scaling)
        self.side_by_side.append(measured)
        for store in self.args.stores:
            scaled = "" if scaling is None else f"; {clients} clients {scaling[store].ratio():.2f}x one"
            print(
                f"  {op} via Writ -> MCP {store:<8} interleaved with the bare proxy, {rounds} rounds of "
                f"{block}: {measured.calls_vs_bare(store):.2f}x its calls/s, "
                f"{measured.cpu_vs_bare(store):.2f}x its CPU (median of rounds){scaled}",
                file=sys.stderr,
                flush=True,
            )

    @contextlib.contextmanager
    def _mcp_gateway(
        self, here: Path, backend_url: str, upstream_url: str, store: str, checks: bool
    ) -> Iterator[tuple[processes.Gateway, str]]:
        """A store and `writ serve` in front of the upstream MCP server, and a token for it."""
        with (
            processes.store_url(store, here) as url,
            processes.gateway(
                here, backend_url, url, upstream_mcp=upstream_url, trace_fsyncs=True, policy_checks=checks
            ) as gw,
        ):
            yield gw, gw.token()

    def _replicas(
        self,
        op: str,
        concurrency: int,
        workdir: Path,
        backend: str,
        upstream: str,
        shared: contextlib.ExitStack,
    ) -> None:
        """Writ on one PostgreSQL store as `--replicas` processes, the clients spread over them."""
        checks = self.args.policy_checks[0]
        here = workdir / f"writ-postgres-{concurrency}-replicas"
        # With --reuse-processes the first replica is the scenario's gateway on PostgreSQL with these
        # checks, already running; the others join its store, secrets and public URL.
        first = self._reused.get(("writ", "postgres", checks)) if self.args.reuse_processes else None
        with contextlib.ExitStack() as own:
            start = partial(self._replica_gateways, here, backend, upstream, checks, first)
            gateways, token = self._started(own, shared, ("replicas",), start)
            session = load.spread(
                [
                    load.through_writ(gw.mcp_url, token, op, MODERN, agent_reads=True, agent_writes=True)
                    for gw in gateways
                ]
            )
            m = self._measure(session, concurrency, [gw.pid for gw in gateways], gateways[0])
        variant = self._checks_variant(checks)
        replicas = len(gateways)
        self._record(
            Row(op, "writ", "postgres", MODERN, concurrency, m, variant, upstream="mcp", replicas=replicas)
        )

    @contextlib.contextmanager
    def _replica_gateways(
        self,
        here: Path,
        backend: str,
        upstream: str,
        checks: bool,
        first: tuple[processes.Gateway, str] | None = None,
    ) -> Iterator[tuple[list[processes.Gateway], str]]:
        """One PostgreSQL store, `--replicas` gateways on it sharing its secrets and public URL, a token;
        given a `first` gateway running (and its token), the others join its store, secrets and URL."""
        with contextlib.ExitStack() as stack:
            gateways: list[processes.Gateway] = []
            if first is None:
                url, secrets = stack.enter_context(processes.store_url("postgres", here)), here
            else:
                gateways.append(first[0])
                url, secrets = first[0].store_url, first[0].workdir
            for n in range(len(gateways), self.args.replicas):
                gateway = processes.gateway(
                    here / f"replica-{n}",
                    backend,
                    url,
                    upstream_mcp=upstream,
                    policy_checks=checks,
                    secrets=secrets,
                    public_url=gateways[0].url if gateways else None,
                )
                gateways.append(stack.enter_context(gateway))
            yield gateways, first[1] if first is not None else gateways[0].token()

    def _checks_variant(self, checks: bool) -> dict[str, Any]:
        """Labels a row with its policy-checks setting once both are measured or it is on."""
        if self.args.policy_checks == [False]:
            return {}
        return {POLICY_CHECKS: "on" if checks else "off"}

    def _concurrencies(self) -> list[int]:
        return [1, *(n for n in self.args.concurrency if n > 1)]

    def run(self) -> None:
        if self.args.only_mcp:
            print(
                "MCP scenario: client -> (direct | bare proxy | Writ) -> upstream MCP server", file=sys.stderr
            )
            self.mcp()
            self._ratios()
            return
        print("direct (backend over HTTP)", file=sys.stderr)
        self.direct()
        print("bare MCP proxy (the SDK stack, nothing of Writ's)", file=sys.stderr)
        self.bare()
        c = self._concurrencies()
        main_plan = [
            ("read", MODERN, 1),
            ("read", LEGACY, 1),
            ("write", MODERN, 1),
            ("write", LEGACY, 1),
            *[(op, MODERN, n) for op in ("read", "write") for n in c if n > 1],
        ]
        for store in self.args.stores:
            print(f"through Writ, {store} store", file=sys.stderr)
            self.writ(store, main_plan)
        if not self.args.no_extras and "sqlite" in self.args.stores:
            seq = [("read", MODERN, 1), ("write", MODERN, 1)]
            print("extras on sqlite: durable=false, json_response=false, repeated reads", file=sys.stderr)
            self.writ("sqlite", seq, durable=False)
            self.writ("sqlite", seq, json_response=False)
            self.writ("sqlite", [("read", MODERN, 1)], repeat_reads=True)
        if not self.args.no_mcp:
            print(
                "MCP scenario: client -> (direct | bare proxy | Writ) -> upstream MCP server", file=sys.stderr
            )
            self.mcp()
        self._ratios()

    def _ratios(self) -> None:
        baseline = {
            (r.op, r.concurrency): r.m.calls_per_s
            for r in self.rows
            if r.target == "direct" and r.upstream == "http"
        }
        for row in self.rows:
            is_baseline = row.target == "direct" and row.upstream == "http"
            if not is_baseline and (base := baseline.get((row.op, row.concurrency))):
                row.ratio = row.m.calls_per_s / base
        bare = {(r.op, r.mode, r.concurrency, r.upstream): r for r in self.rows if r.target == "bare"}
        for row in self.rows:
            proxy = bare.get((row.op, row.mode, row.concurrency, row.upstream))
            if row.target != "writ" or proxy is None:
                continue
            row.vs_bare = row.m.calls_per_s / proxy.m.calls_per_s
            cpu, proxy_cpu = row.m.server_cpu_ms_per_call(), proxy.m.server_cpu_ms_per_call()
            if cpu is not None and proxy_cpu:
                row.cpu_vs_bare = cpu / proxy_cpu
        for on, off in checks_pairs(self.rows):
            on.on_vs_off = on.m.calls_per_s / off.m.calls_per_s
            cpu, off_cpu = on.m.server_cpu_ms_per_call(), off.m.server_cpu_ms_per_call()
            if cpu is not None and off_cpu:
                on.cpu_on_vs_off = cpu / off_cpu


def _checks_on(row: Row) -> bool:
    return row.variant.get(POLICY_CHECKS) == "on"


def checks_pairs(rows: list[Row]) -> list[tuple[Row, Row]]:
    """Each Writ row with policy checks on, with the same row's (operation, store, mode, clients,
    upstream) with them off in the same run."""

    def key(r: Row) -> tuple[Any, ...]:
        return (r.op, r.store, r.replicas, r.mode, r.concurrency, r.upstream)

    off = {key(r): r for r in rows if r.variant.get(POLICY_CHECKS) == "off"}
    return [(r, off[key(r)]) for r in rows if _checks_on(r) and key(r) in off]


def checks_table(rows: list[Row]) -> str:
    """The cost of the demo's loop rules and budgets: each pair of rows, off and on, side by side."""
    lines = [
        "| scenario | store | clients | calls/s off -> on | on/off calls/s | gateway CPU ms/call off -> on "
        "| on/off CPU | fsyncs/call off -> on | store bytes/call off -> on "
        "| counted/call: budget, loop marks | load off, on |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for on, off in checks_pairs(rows):
        cpu_off, cpu_on = off.m.server_cpu_ms_per_call(), on.m.server_cpu_ms_per_call()
        bytes_off, bytes_on = off.m.per_call("store_bytes"), on.m.per_call("store_bytes")
        lines.append(
            f"| {on.scenario} | {on.store} | {on.concurrency} "
            f"| {off.m.calls_per_s:.1f} -> {on.m.calls_per_s:.1f} | {_x(on.on_vs_off)} "
            f"| {_num(cpu_off, '.2f')} -> {_num(cpu_on, '.2f')} | {_x(on.cpu_on_vs_off)} "
            f"| {_fsyncs(off.m)} -> {_fsyncs(on.m)} "
            f"| {_num(bytes_off, '.0f')} -> {_num(bytes_on, '.0f')} "
            f"| {_num(on.m.per_call('budget_calls'), '.2f')}, {_num(on.m.per_call('loop_marks'), '.2f')} "
            f"| {off.loadavg:.1f}, {on.loadavg:.1f} |"
        )
    return "\n".join(lines)


def table(rows: list[Row]) -> str:
    head = (
        "| scenario | store | mode | concurrency | calls | calls/s | p50 ms | p99 ms | ratio vs direct "
        "| server CPU ms/call | client CPU ms/call | calls/s vs bare proxy | CPU vs bare proxy "
        "| fsyncs/call | store bytes/call | load |"
    )
    lines = [head, "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        cpu = r.m.server_cpu_ms_per_call()
        lines.append(
            f"| {r.scenario} | {r.store_label} | {r.mode} | {r.concurrency} | {r.m.calls} "
            f"| {r.m.calls_per_s:.1f} | {r.m.percentile_ms(50):.2f} | {r.m.percentile_ms(99):.2f} "
            f"| {_x(r.ratio)} | {'-' if cpu is None else f'{cpu:.2f}'} "
            f"| {r.m.client_cpu_ms_per_call():.2f} | {_x(r.vs_bare)} | {_x(r.cpu_vs_bare)} "
            f"| {_fsyncs(r.m)} | {_num(r.m.per_call('store_bytes'), '.0f')} | {r.loadavg:.1f} |"
        )
    return "\n".join(lines)


def _fsyncs(m: load.Measurement) -> str:
    # SQLite's fsyncs are the gateway's own; PostgreSQL's are its server's WAL syncs, cluster-wide.
    own, wal = m.per_call("gateway_fsyncs"), m.per_call("server_wal_syncs")
    if wal is not None:
        return f"{_num(own, '.2f')} + ≤{wal:.2f} WAL"
    return _num(own, ".2f")


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _x(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def aims(rows: list[Row]) -> list[str]:
    """The issues' aims, read off the sequential 2026-07-28 rows of each store (reported, not enforced)."""
    out = []
    targets: dict[str, Callable[[float], bool]] = {"read": lambda r: r >= 0.5, "write": lambda r: r >= 1 / 3}
    http = [r for r in rows if r.upstream == "http"]
    for r in http:
        if r.target == "writ" and r.concurrency == 1 and r.mode == MODERN and not r.variant and r.ratio:
            aim = "0.50" if r.op == "read" else "0.33"
            verdict = "met" if targets[r.op](r.ratio) else "not met"
            out.append(f"{r.op} on {r.store}: {r.ratio:.2f}x direct (aim >= {aim}x): {verdict}")
    for r in http:
        # What the SDK stack allows any gateway: with nothing of Writ's, the bare proxy's ratio is a ceiling.
        if r.target == "bare" and r.mode == MODERN and r.ratio:
            out.append(f"{r.op} via the bare MCP proxy (no Writ at all): {r.ratio:.2f}x direct, the ceiling")
    direct = {r.op: r for r in http if r.target == "direct" and r.concurrency == 1}
    clients = [r for r in http if r.target == "writ" and r.concurrency == 1 and r.mode == MODERN]
    if "read" in direct and (reads := [r for r in clients if r.op == "read"]):
        # Sequential calls add up: the MCP client's own CPU per call plus the backend's is a floor
        # under any call through a gateway, before the gateway does anything.
        budget = 2 * 1000 / direct["read"].m.calls_per_s
        client = min(r.m.client_cpu_ms_per_call() for r in reads)
        backend = direct["read"].m.server_cpu_ms_per_call() or 0.0
        out.append(
            f"read at 0.5x direct leaves {budget:.2f} ms per call; the official MCP client alone uses "
            f"{client:.2f} ms of CPU per call and the backend {backend:.2f} ms"
        )
    return out + mcp_aims(rows)


def _verdict(met: bool) -> str:
    return "met" if met else "not met"


def mcp_aims(rows: list[Row]) -> list[str]:
    """Issue 16's aims, relative to the bare MCP proxy in front of the same upstream MCP server."""
    out = []
    mcp_writ = [r for r in rows if r.upstream == "mcp" and r.target == "writ" and not _checks_on(r)]
    writ = {(r.op, r.store, r.concurrency): r for r in mcp_writ if r.replicas == 1}
    for (op, store, concurrency), r in writ.items():
        if concurrency != 1 or r.vs_bare is None:
            continue
        aim = 0.7 if op == "read" else 0.55
        line = f"MCP {op} on {store}: {r.vs_bare:.2f}x the bare proxy's calls/s (aim >= {aim}x): "
        line += _verdict(r.vs_bare >= aim)
        if op == "read" and r.cpu_vs_bare is not None:
            cpu = f"; gateway CPU {r.cpu_vs_bare:.2f}x the bare proxy's (aim <= 2x): "
            line += cpu + _verdict(r.cpu_vs_bare <= 2)
        out.append(line)
    sqlite, postgres = writ.get(("read", "sqlite", 1)), writ.get(("read", "postgres", 1))
    if sqlite and postgres:
        slower = sqlite.m.calls_per_s / postgres.m.calls_per_s
        out.append(
            f"MCP read on postgres: SQLite's calls/s are {slower:.2f}x PostgreSQL's (aim <= 1.3x): "
            + _verdict(slower <= 1.3)
        )
    for (op, store, concurrency), r in writ.items():
        alone = writ.get((op, store, 1))
        if concurrency > 1 and alone is not None:
            gain = r.m.calls_per_s / alone.m.calls_per_s
            out.append(
                f"MCP {op} on {store} with {concurrency} clients: {gain:.2f}x its sequential calls/s "
                f"(aim >= 1.3x with 8): {_verdict(gain >= 1.3)}"
            )
        fsyncs = r.m.per_call("gateway_fsyncs")
        wal = r.m.per_call("server_wal_syncs")
        if concurrency > 1 and (fsyncs is not None or wal is not None):
            # PostgreSQL's WAL syncs are counted for the whole server: an upper bound on a shared one.
            total = (fsyncs or 0.0) + (wal or 0.0)
            bound = " at most" if wal is not None else ""
            out.append(
                f"MCP {op} on {store} with {concurrency} clients:{bound} {total:.2f} fsyncs per call "
                f"(aim < 0.5 with 8): {_verdict(total < 0.5)}"
            )
        grown = r.m.per_call("store_bytes")
        if grown is not None:
            out.append(
                f"MCP {op} on {store} with {concurrency} clients: the store grew {grown:.0f} bytes per call "
                f"(aim <= 2560): {_verdict(grown <= 2560)}"
            )
    for r in mcp_writ:
        one, alone = writ.get((r.op, r.store, r.concurrency)), writ.get((r.op, r.store, 1))
        if r.replicas == 1 or one is None or alone is None:
            continue
        # No aim of its own: what a second process on the same store adds, beside one process.
        wal = r.m.per_call("server_wal_syncs")
        out.append(
            f"MCP {r.op} on {r.store}, {r.replicas} replicas with {r.concurrency} clients: "
            f"{r.m.calls_per_s / one.m.calls_per_s:.2f}x one replica's calls/s with as many clients, "
            f"{r.m.calls_per_s / alone.m.calls_per_s:.2f}x its sequential calls/s; "
            f"at most {_num(wal, '.2f')} WAL syncs per call"
        )
    return out


def side_by_side_aims(measured: list[SideBySide]) -> list[str]:
    """Issue 16's aims from the interleaved runs: the same comparisons as `mcp_aims`' sequential ones,
    without the machine's moment in them (each target's blocks ran between the bare proxy's)."""
    out = []
    for m in measured:
        aim = 0.7 if m.op == "read" else 0.55
        stores = [name for name in m.targets if name != "bare proxy"]
        for store in stores:
            calls = m.calls_vs_bare(store)
            line = (
                f"MCP {m.op} on {store}, interleaved: {calls:.2f}x the bare proxy's calls/s "
                f"(aim >= {aim}x): {_verdict(calls >= aim)}"
            )
            if m.op == "read":
                cpu = m.cpu_vs_bare(store)
                line += f"; gateway CPU {cpu:.2f}x the bare proxy's (aim <= 2x): {_verdict(cpu <= 2)}"
            out.append(line + f" ({m.rounds} rounds of {m.block})")
            if m.scaling is not None:
                scaled = m.scaling[store]
                ratio = scaled.ratio()
                out.append(
                    f"MCP {m.op} on {store} with {scaled.clients} clients, interleaved: {ratio:.2f}x its "
                    f"calls/s from one client (aim >= 1.3x with 8): {_verdict(ratio >= 1.3)} "
                    f"({m.rounds} rounds of {m.block})"
                )
        if m.op == "read" and {"sqlite", "postgres"} <= set(stores):
            sqlite, postgres = m.targets["sqlite"], m.targets["postgres"]
            slower = sqlite.calls_vs(postgres)
            out.append(
                f"MCP read on postgres, interleaved: SQLite's calls/s are {slower:.2f}x PostgreSQL's "
                f"(aim <= 1.3x): {_verdict(slower <= 1.3)}"
            )
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200, help="measured calls per scenario (default 200)")
    parser.add_argument(
        "--concurrency", default="8", help="clients of the concurrent rows, comma-separated (default 8)"
    )
    parser.add_argument("--stores", default="sqlite,postgres", help="comma-separated: sqlite,postgres")
    parser.add_argument("--warmup", type=int, default=40, help="unmeasured calls before each scenario")
    parser.add_argument("--no-extras", action="store_true", help="skip the durable=false and JSON-mode rows")
    parser.add_argument(
        "--reuse-processes",
        action="store_true",
        help="one set of processes per scenario, not one per row: one backend, store and gateway per "
        "store and variant for all its rows, one backend (and bare proxy, upstream) for the direct and bare "
        "rows (quicker, and each row then starts from the previous rows' state: for checking the benchmark "
        "still runs, not for figures)",
    )
    parser.add_argument("--no-mcp", action="store_true", help="skip the scenario with an upstream MCP server")
    parser.add_argument(
        "--only-mcp", action="store_true", help="run only the scenario with an upstream MCP server"
    )
    parser.add_argument("--ops", default="read,write", help="the MCP scenario's operations: read,write")
    parser.add_argument(
        "--replicas",
        type=int,
        default=2,
        help="the MCP scenario's concurrent rows on PostgreSQL also run as this many Writ processes on "
        "one store, the clients spread over them (default 2; 1 leaves those rows out)",
    )
    parser.add_argument(
        "--policy-checks",
        default="off",
        help="the MCP scenario's Writ rows with the demo's loop rules and budgets off, on, or both "
        "(off,on: each row twice, side by side, with the on/off ratios printed; default off)",
    )
    parser.add_argument(
        "--interleave",
        type=int,
        default=8,
        help="rounds of the MCP scenario's sequential aims measured side by side after each "
        "operation's rows: the bare proxy and Writ on each store in turn (default 8; 0 leaves them out)",
    )
    parser.add_argument(
        "--interleave-block", type=int, default=50, help="calls per target and round (default 50)"
    )
    parser.add_argument(
        "--interleave-clients",
        type=int,
        default=8,
        help="clients of the interleaved turns that measure how Writ scales: a block from one client "
        "and one from this many, each round (default 8; 0 or 1 leaves them out)",
    )
    parser.add_argument("--out", default="bench/results/latest.json", help="where to write the JSON")
    parser.add_argument("--tree", help="run the gateway from this source tree (default: this checkout)")
    parser.add_argument("--workdir", help="keep every process's files and logs here (default: a temp dir)")
    parser.add_argument(
        "--keep-stores",
        action="store_true",
        help="leave the PostgreSQL schemas behind (each writ.yaml under --workdir names its URL), for "
        "bench/store_bytes.py --db; drop them yourself afterwards",
    )
    args = parser.parse_args(argv)
    args.stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    args.ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    args.concurrency = [int(n) for n in str(args.concurrency).split(",") if n.strip()]
    settings = [c.strip() for c in args.policy_checks.split(",") if c.strip()]
    if not settings or not set(settings) <= {"off", "on"}:
        parser.error(f"--policy-checks: {args.policy_checks!r}: use off, on or off,on")
    args.policy_checks = [c == "on" for c in dict.fromkeys(settings)]
    if args.interleave < 0 or args.interleave_block < 1 or args.interleave_clients < 0:
        parser.error(
            "--interleave takes 0 or more rounds, --interleave-block 1 or more calls, "
            "--interleave-clients 0 or more"
        )
    if args.interleave and args.interleave_clients > 1 and args.interleave_block < args.interleave_clients:
        parser.error(
            f"--interleave-block {args.interleave_block} cannot give each of "
            f"--interleave-clients {args.interleave_clients} a call"
        )

    if args.tree:
        processes.use_tree(Path(args.tree))
    processes.KEEP_SCHEMAS = args.keep_stores
    load_before = os.getloadavg()
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        workdir = args.workdir or stack.enter_context(tempfile.TemporaryDirectory(prefix="writ-bench-"))
        bench = Bench(args, Path(workdir))
        bench.run()
    elapsed = time.perf_counter() - started

    print(table(bench.rows))
    print()
    if checks_pairs(bench.rows):
        print("Policy checks (the demo's loop rules and budgets), off and on:\n")
        print(checks_table(bench.rows))
        print()
    every_aim = aims(bench.rows) + side_by_side_aims(bench.side_by_side)
    for line in every_aim:
        print(f"- {line}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "date": datetime.now(UTC).isoformat(timespec="seconds"),
                "command": " ".join(
                    ["python", "bench/run.py", *(argv if argv is not None else sys.argv[1:])]
                ),
                "machine": {
                    "cpus": os.cpu_count(),
                    "platform": platform.platform(),
                    "python": sys.version.split()[0],
                },
                "settings": {**vars(args)},
                "elapsed_s": round(elapsed, 1),
                # Other work on the machine skews every number; a load average near the core count says so.
                "loadavg_1m": {"start": round(load_before[0], 2), "end": round(os.getloadavg()[0], 2)},
                "rows": [r.to_json() for r in bench.rows],
                "policy_checks": [
                    {
                        "op": on.op,
                        "store": on.store,
                        "concurrency": on.concurrency,
                        "on_vs_off_calls_per_s": _round(on.on_vs_off),
                        "on_vs_off_cpu": _round(on.cpu_on_vs_off),
                    }
                    for on, _ in checks_pairs(bench.rows)
                ],
                "interleaved": [m.to_json() for m in bench.side_by_side],
                "aims": every_aim,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"\nwrote {out} ({elapsed:.0f}s)", file=sys.stderr)


if __name__ == "__main__":
    main()
