"""A fault campaign against real processes: acme-payments and `writ serve`, crashed and restarted.

Each round starts a gateway told to die (`os._exit(137)`, via gateway/faults.py) the nth time it
reaches one durable boundary of the pipeline. The calls before the crash each meet a backend fault
(commit-and-drop, late answer, 500 after commit, hang); the nth call meets the crash. The next round
restarts Writ on the same store, whose workers recover the dead dispatch and reconcile it. At the end
the invariants are checked against the backend's own record of effects and Writ's log.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from gateway.dev_issuer import DevIssuer
from gateway.faults import CRASH_ENV, POINTS
from store import Store
from tests.e2e.harness import WRIT, Backend, demo_config, free_port, mcp_client, stop, wait_http

BACKEND_FAULTS: dict[str, dict[str, int]] = {
    "backend: commit, drop answer": {"drop_responses": 1},
    "backend: late answer": {"delay_ms": 1200},
    "backend: 500 after commit": {"fail_after_commit": 1},
    "backend: hang": {"hang": 1},
}
TIMEOUT_S = 0.5
WORKERS = {"interval_s": 0.2, "executor_grace_s": 0.3, "lease_margin_s": 1.0, "reconcile_backoff_s": 0.2}
ARGS = {"order_id": "1003", "amount": 1, "currency": "USD", "reason": "fault campaign"}


@dataclass
class Trial:
    key: str
    point: str
    tool_call_id: str | None = None
    """What the client was told, if it was told anything."""


@dataclass
class Campaign:
    workdir: Path
    backend: Backend
    store_url: str
    port: int = field(default_factory=free_port)
    trials: list[Trial] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> Path:
        return demo_config(
            self.workdir,
            gateway_port=self.port,
            backend_url=self.backend.url,
            store_url=self.store_url,
            timeout_s=TIMEOUT_S,
            overrides={"workers": WORKERS},
        )

    def token(self) -> str:
        issuer = DevIssuer.load_or_create(self.workdir / "dev-issuer.jwk", f"{self.url}/dev-issuer")
        return issuer.mint(subject="agent-1", audience=f"{self.url}/mcp", tenant="acme", roles=["agent"])

    @contextlib.contextmanager
    def gateway(self, crash_at: str | None = None) -> Iterator[subprocess.Popen[Any]]:
        env = {k: v for k, v in os.environ.items() if k != CRASH_ENV}
        if crash_at:
            env[CRASH_ENV] = crash_at
        log = (self.workdir / "writ.log").open("a")
        process = subprocess.Popen(
            [*WRIT, "serve", "-c", str(self.config())], cwd=self.workdir, env=env, stdout=log, stderr=log
        )
        try:
            wait_http(f"{self.url}/healthz", process)
            yield process
        finally:
            stop(process)
            log.close()

    async def round(self, number: int, point: str, nth: int, token: str) -> None:
        """Calls 1..nth-1 meet a backend fault each; call nth crashes the gateway at `point`."""
        faults = list(BACKEND_FAULTS)
        with self.gateway(f"{point}:{nth}") as process:
            crashing = False
            try:
                async with mcp_client(f"{self.url}/mcp", token, mode="2026-07-28") as client:
                    for i in range(1, nth + 1):
                        crashing = i == nth
                        label = point if crashing else faults[(number + i) % len(faults)]
                        trial = Trial(f"r{number}-c{i}", label)
                        self.trials.append(trial)
                        self.backend.chaos(**({} if crashing else BACKEND_FAULTS[label]))
                        trial.tool_call_id = await self._call(client, trial.key, expect_answer=not crashing)
            except Exception:  # the client's transport also fails on the way out once the server died
                if not crashing:
                    raise
            with anyio.fail_after(10):
                while process.poll() is None:
                    await anyio.sleep(0.02)
            assert process.returncode == 137, f"round {number}: expected the crash at {point}:{nth}"
        self.backend.chaos()

    async def _call(self, client: Any, key: str, *, expect_answer: bool) -> str | None:
        try:
            with anyio.fail_after(15):
                result = await client.call_tool("refund_order", ARGS, meta={"writ/idempotencyKey": key})
        except Exception:  # the gateway died mid-call: the client hears nothing (or a transport error)
            if expect_answer:
                raise
            return None
        return (result.meta or {}).get("writ/toolCallId")

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
                        again = await self._call(client, trial.key, expect_answer=True)
                        call = store.find_call_by_key("acme", trial.key)
                        assert call is not None and again == call.tool_call_id, trial

    def report(self) -> dict[str, dict[str, int]]:
        """Per fault: trials, trials whose effect happened, duplicates, lost intents, unresolved, and
        wrong verdicts (the log says completed but the backend has no effect, or the reverse)."""
        table: dict[str, dict[str, int]] = {}
        with Store.open(self.store_url) as store:
            for trial in self.trials:
                row = table.setdefault(
                    trial.point,
                    {"trials": 0, "effects": 0, "duplicates": 0, "lost": 0, "unresolved": 0, "wrong": 0},
                )
                row["trials"] += 1
                effects = len(self.backend.refunds(trial.key))
                call = store.find_call_by_key("acme", trial.key)
                row["effects"] += effects > 0
                row["duplicates"] += effects > 1
                told = trial.tool_call_id is not None
                row["lost"] += call is None and (told or effects > 0 or trial.point in POINTS)
                if call is None:
                    continue
                row["lost"] += told and call.tool_call_id != trial.tool_call_id
                row["unresolved"] += call.status not in ("completed", "failed")
                # The log's verdict must match what the backend really did.
                row["wrong"] += (call.status == "completed") != (effects == 1)
        return table


def format_table(table: dict[str, dict[str, int]]) -> str:
    columns = ("trials", "effects", "duplicates", "lost", "unresolved", "wrong")
    lines = [f"{'fault':<32}" + "".join(f"{c:>12}" for c in columns)]
    for name, row in table.items():
        lines.append(f"{name:<32}" + "".join(f"{row[c]:>12}" for c in columns))
    totals = {c: sum(row[c] for row in table.values()) for c in columns}
    lines.append(f"{'total':<32}" + "".join(f"{totals[c]:>12}" for c in columns))
    return "\n".join(lines)
