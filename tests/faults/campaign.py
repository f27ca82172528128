"""A fault campaign against real processes: acme-payments and `writ serve`, crashed and restarted.

Each round starts a gateway told to die (`os._exit(137)`, via gateway/faults.py) the nth time it
reaches one durable boundary of the pipeline. The calls before the crash each meet a backend fault
(commit-and-drop, late answer, 500 after commit, hang); the nth call meets the crash. The next round
restarts Writ on the same store, whose workers recover the dead dispatch and reconcile it. At the end
the invariants are checked against the backend's own record of effects and Writ's log.

On PostgreSQL the gateway reaches the database through a relay (tests/faults/plug.py), and each round
has one more call, whose database connection is cut while it is in flight: the gateway freezes itself
(`WRIT_FAULT_STOP_AT`) after the dispatching commit or after the backend answered, the plug is pulled,
the gateway is woken, and the plug goes back in once the client has its answer. Its outcome cannot be
recorded, so the client must hear `result_unknown`, and the call must be reconciled like any other.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from gateway.dev_issuer import DevIssuer
from gateway.faults import CRASH_ENV, POINTS, STOP_ENV
from store import Store
from tests.e2e.harness import WRIT, Backend, demo_config, free_port, mcp_client, stop, wait_http
from tests.faults.plug import Plug, through

BACKEND_FAULTS: dict[str, dict[str, int]] = {
    "backend: commit, drop answer": {"drop_responses": 1},
    "backend: late answer": {"delay_ms": 1200},
    "backend: 500 after commit": {"fail_after_commit": 1},
    "backend: hang": {"hang": 1},
}
STORE_FAULTS: dict[str, str] = {
    "store: cut before the request": "after_dispatching_commit",
    "store: cut after the answer": "after_execute",
}
"""PostgreSQL only: the fault point the gateway freezes at while its database connection is cut."""
FINAL = ("completed", "failed")
TIMEOUT_S = 0.5
WORKERS = {"interval_s": 0.2, "executor_grace_s": 0.3, "lease_margin_s": 1.0, "reconcile_backoff_s": 0.2}
ARGS = {"order_id": "1003", "amount": 1, "currency": "USD", "reason": "fault campaign"}


def plan(number: int, *, store_faults: bool) -> list[str]:
    """The fault each call of round `number` meets, in order; the last one crashes the gateway."""
    point = POINTS[number % len(POINTS)]
    cycle = number // len(POINTS)
    nth = 2 + cycle % 5  # 1-5 backend faults (and on PostgreSQL one store fault), then the crash
    faults = list(BACKEND_FAULTS)
    labels = [faults[(number + i) % len(faults)] for i in range(1, nth)]
    if store_faults:  # one cut per round, anywhere before the crash
        labels.insert(number % nth, list(STORE_FAULTS)[cycle % len(STORE_FAULTS)])
    return [*labels, point]


def stopped(pid: int) -> bool:
    """Whether the process is stopped (SIGSTOP), as /proc says."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


@dataclass
class Trial:
    key: str
    point: str
    tool_call_id: str | None = None
    """What the client was told, if it was told anything."""
    status: str | None = None
    """The status the client was told, if it was told anything."""


@dataclass
class Campaign:
    workdir: Path
    backend: Backend
    store_url: str
    plug: Plug | None = None
    """Set on PostgreSQL: the gateway reaches the database through it, and rounds cut it once."""
    port: int = field(default_factory=free_port)
    trials: list[Trial] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def faults(self) -> list[str]:
        """The faults the calls before each round's crash meet."""
        return [*BACKEND_FAULTS, *(STORE_FAULTS if self.plug else ())]

    def config(self) -> Path:
        return demo_config(
            self.workdir,
            gateway_port=self.port,
            backend_url=self.backend.url,
            store_url=through(self.plug, self.store_url) if self.plug else self.store_url,
            timeout_s=TIMEOUT_S,
            overrides={"workers": WORKERS},
        )

    def token(self) -> str:
        issuer = DevIssuer.load_or_create(self.workdir / "dev-issuer.jwk", f"{self.url}/dev-issuer")
        return issuer.mint(subject="agent-1", audience=f"{self.url}/mcp", tenant="acme", roles=["agent"])

    @contextlib.contextmanager
    def gateway(self, **faults: str) -> Iterator[subprocess.Popen[Any]]:
        env = {k: v for k, v in os.environ.items() if k not in (CRASH_ENV, STOP_ENV)} | faults
        log = (self.workdir / "writ.log").open("a")
        process = subprocess.Popen(
            [*WRIT, "serve", "-c", str(self.config())], cwd=self.workdir, env=env, stdout=log, stderr=log
        )
        try:
            wait_http(f"{self.url}/healthz", process)
            yield process
        finally:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGCONT)  # SIGTERM stays pending while a process is stopped
            stop(process)
            log.close()

    async def run(self, target: int, token: str) -> None:
        """Rounds until at least `target` trials ran, then settle every call."""
        number = 0
        while len(self.trials) < target:
            await self.round(number, token)
            number += 1
        await self.settle(token)

    async def round(self, number: int, token: str) -> None:
        """Each call but the last meets a backend (or store) fault; the last crashes the gateway."""
        labels = plan(number, store_faults=self.plug is not None)
        # Every call reaches every fault point once, so call i reaches each point for the ith time.
        env = {CRASH_ENV: f"{labels[-1]}:{len(labels)}"}
        for i, label in enumerate(labels, 1):
            if label in STORE_FAULTS:
                env[STOP_ENV] = f"{STORE_FAULTS[label]}:{i}"
        with self.gateway(**env) as process:
            crashing = False
            try:
                async with mcp_client(f"{self.url}/mcp", token, mode="2026-07-28") as client:
                    for i, label in enumerate(labels, 1):
                        crashing = i == len(labels)
                        trial = Trial(f"r{number}-c{i}", label)
                        self.trials.append(trial)
                        self.backend.chaos(**BACKEND_FAULTS.get(label, {}))
                        if label in STORE_FAULTS:
                            told = await self._call_with_store_cut(client, trial.key, process)
                        else:
                            told = await self._call(client, trial.key, expect_answer=not crashing)
                        trial.tool_call_id, trial.status = told
            except Exception:  # the client's transport also fails on the way out once the server died
                if not crashing:
                    raise
            with anyio.fail_after(10):
                while process.poll() is None:
                    await anyio.sleep(0.02)
            assert process.returncode == 137, f"round {number}: expected the crash at {env[CRASH_ENV]}"
        self.backend.chaos()

    async def _call(self, client: Any, key: str, *, expect_answer: bool) -> tuple[str | None, str | None]:
        try:
            with anyio.fail_after(15):
                result = await client.call_tool("refund_order", ARGS, meta={"writ/idempotencyKey": key})
        except Exception:  # the gateway died mid-call: the client hears nothing (or a transport error)
            if expect_answer:
                raise
            return None, None
        meta = result.meta or {}
        return meta.get("writ/toolCallId"), meta.get("writ/status")

    async def _call_with_store_cut(
        self, client: Any, key: str, process: subprocess.Popen[Any]
    ) -> tuple[str | None, str | None]:
        """The call, with the database cut while the gateway is frozen at the call's stop point."""
        assert self.plug is not None
        told: list[tuple[str | None, str | None]] = []

        async def call() -> None:
            told.append(await self._call(client, key, expect_answer=True))

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                with anyio.fail_after(15):
                    while not stopped(process.pid):
                        await anyio.sleep(0.01)
                self.plug.pull()
                os.kill(process.pid, signal.SIGCONT)
        finally:
            self.plug.plug_in()
        return told[0]

    async def settle(self, token: str, deadline_s: float = 60.0) -> None:
        """Run a fault-free gateway until nothing is dispatching or awaiting reconciliation."""
        with self.gateway(), Store.open(self.store_url) as store:
            with anyio.fail_after(deadline_s):
                while any(
                    c.status == "dispatching" or (c.status == "result_unknown" and not c.escalated)
                    for c in store.list_calls(limit=100_000)
                ):
                    await anyio.sleep(0.2)
            # A client that re-sends a call it never heard back about joins the recorded call.
            async with mcp_client(f"{self.url}/mcp", token, mode="2026-07-28") as client:
                for trial in self.trials:
                    if trial.point in POINTS:
                        again, _ = await self._call(client, trial.key, expect_answer=True)
                        call = store.find_call_by_key("acme", "agent-1", trial.key)
                        assert call is not None and again == call.tool_call_id, trial

    def report(self) -> dict[str, dict[str, int]]:
        """Per fault: trials, trials whose effect happened, duplicates, lost intents, unresolved, and
        wrong verdicts (the log says completed but the backend has no effect, or the reverse; or the
        client was told a final status that the dispatch did not record)."""
        table: dict[str, dict[str, int]] = {}
        with Store.open(self.store_url) as store:
            for trial in self.trials:
                row = table.setdefault(
                    trial.point,
                    {"trials": 0, "effects": 0, "duplicates": 0, "lost": 0, "unresolved": 0, "wrong": 0},
                )
                row["trials"] += 1
                effects = len(self.backend.refunds(trial.key))
                call = store.find_call_by_key("acme", "agent-1", trial.key)
                row["effects"] += effects > 0
                row["duplicates"] += effects > 1
                told = trial.tool_call_id is not None
                row["lost"] += call is None and (told or effects > 0 or trial.point in POINTS)
                if call is None:
                    continue
                row["lost"] += told and call.tool_call_id != trial.tool_call_id
                row["unresolved"] += call.status not in FINAL
                # The log's verdict must match what the backend really did; a client told a final status
                # must have been told the outcome the dispatch recorded (not one reconciliation found).
                recorded = {e.type for e in store.events(tool_call_id=call.tool_call_id)}
                told_wrong = trial.status in FINAL and (
                    trial.status != call.status or f"tool_call.{trial.status}" not in recorded
                )
                row["wrong"] += (call.status == "completed") != (effects == 1) or told_wrong
        return table


def format_table(table: dict[str, dict[str, int]]) -> str:
    columns = ("trials", "effects", "duplicates", "lost", "unresolved", "wrong")
    lines = [f"{'fault':<32}" + "".join(f"{c:>12}" for c in columns)]
    order = [*POINTS, *BACKEND_FAULTS, *STORE_FAULTS]  # the crashes first, then the faults in between
    for name, row in sorted(table.items(), key=lambda item: order.index(item[0])):
        lines.append(f"{name:<32}" + "".join(f"{row[c]:>12}" for c in columns))
    totals = {c: sum(row[c] for row in table.values()) for c in columns}
    lines.append(f"{'total':<32}" + "".join(f"{totals[c]:>12}" for c in columns))
    return "\n".join(lines)
