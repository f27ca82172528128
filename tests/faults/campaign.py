"""A fault campaign against real processes: acme-payments and `writ serve`, crashed and restarted.

Each round starts a gateway told to die (`os._exit(137)`, via gateway/calls/faults.py) the nth time it
reaches one durable boundary of the pipeline. The calls before the crash each meet a backend fault
(commit-and-drop, late answer, 500 after commit, hang); the nth call meets the crash. The next round
restarts Writ on the same store, whose workers recover the dead dispatch and reconcile it. At the end
the invariants are checked against the backend's own record of effects and Writ's log.

On PostgreSQL the gateway reaches the database through a relay (tests/faults/plug.py), and each round
has one more call, whose database connection is cut while it is in flight: the gateway freezes itself
(`WRIT_FAULT_STOP_AT`) after the dispatching commit or after the backend answered, the plug is pulled,
the gateway is woken, and the plug goes back in once the client has its answer. Its outcome cannot be
recorded, so the client must hear `result_unknown`, and the call must be reconciled like any other.

Two faults are a backend that is slow *before* it commits, the fault that makes "not found" a lie: a
queue in front of acme-payments holds the refund past the timeout and then runs it (`commit_delay_ms`), or the
backend process freezes itself (SIGSTOP, `freeze`) with the refund read and not yet run, and the test
wakes it (SIGCONT) after the timeout. Their calls carry no idempotency key, as a model's do, and the
model re-sends the identical call at once and again at the end, when the first one has a verdict:
each re-send must join the first call, or the derived key is dispatched twice. After every trial,
every settled verdict whose refund is no longer queued is checked against the backend's own record
(`check_verdicts`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio

from gateway.auth.dev_issuer import DevIssuer
from gateway.calls.faults import CRASH_ENV, POINTS, STOP_ENV
from store import Store
from store.model import CallView
from tests.e2e.harness import WRIT, Backend, demo_config, free_port, mcp_client, sent_for, stop, wait_http
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
SLOW_FAULTS: tuple[str, ...] = ("backend: slow before commit", "backend: frozen across the timeout")
"""The backend runs the refund after the call timed out: held in a queue, or frozen with it read."""
FINAL = ("completed", "failed")
PARTITION_BY = os.environ.get("WRIT_FAULT_PARTITION_BY", "none")
"""`store.log.partition_by` of the gateways the campaign runs (`run.py --partition-by`)."""
TIMEOUT_S = 0.5
HORIZON_S = 4.0
"""How long after it was sent a refund may still land at acme-payments in the campaign's config."""
HOLDS_MS = (550, 650, 800, 1000, 1300, 1600, 2000)
"""How long the queue holds a refund: past the timeout, around the reconciler's first lookups (about
interval_s after the timeout, then every reconcile_backoff_s, doubling) and up to half the horizon:
a refund that lands after the horizon its operator declared is a broken declaration no gateway can
see, not a fault this suite should count, and on a loaded machine (load 8 on 2 cores) a refund held
1.3 s was seen to commit more than 2.7 s after it was sent."""
FREEZES_MS = (600, 900, 1200, 1600)
"""How long the backend stays frozen: across the timeout and lookups that cannot get an answer."""
WORKERS = {
    "interval_s": 0.2,
    "executor_grace_s": 0.3,
    "lease_margin_s": 1.0,
    "reconcile_backoff_s": 0.2,
    # Lookups at a frozen backend time out (inconclusive): enough attempts to outlast the freeze.
    "reconcile_max_attempts": 12,
}
ARGS = {"order_id": "1003", "amount": 1, "currency": "USD", "reason": "fault campaign"}


def plan(number: int, *, store_faults: bool) -> list[str]:
    """The fault each call of round `number` meets, in order; the last one crashes the gateway."""
    point = POINTS[number % len(POINTS)]
    cycle = number // len(POINTS)
    # 1-5 backend faults (and on PostgreSQL one store fault), then the crash; the first cycle has 4, so
    # that its rounds, one per crash point, meet every backend fault and both store cuts as well.
    nth = 2 + (cycle + 3) % 5
    faults = [*BACKEND_FAULTS, *SLOW_FAULTS]
    labels = [faults[(number + i) % len(faults)] for i in range(1, nth)]
    if store_faults:  # one cut per round, anywhere before the crash
        labels.insert(number % nth, list(STORE_FAULTS)[number % len(STORE_FAULTS)])
    return [*labels, point]


def stopped(pid: int) -> bool:
    """Whether the process is stopped (SIGSTOP), as /proc says."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


@dataclass
class Trial:
    key: str
    """The idempotency key: the client's, or for a call sent without one (`arguments`) the derived key
    Writ recorded for it."""
    point: str
    tool_call_id: str | None = None
    """What the client was told, if it was told anything."""
    status: str | None = None
    """The status the client was told, if it was told anything."""
    arguments: dict[str, Any] | None = None
    """Set for a call sent without an idempotency key: its arguments, unique to the trial."""
    resends: list[str | None] = field(default_factory=list)
    """The toolCallIds the identical re-sends of a call without a key were told."""
    contradicted: bool = False
    """A settled verdict was found contradicting the backend's record after some trial."""


@dataclass
class Campaign:
    workdir: Path
    backend: Backend
    store_url: str
    plug: Plug | None = None
    """Set on PostgreSQL: the gateway reaches the database through it, and rounds cut it once."""
    port: int = field(default_factory=free_port)
    trials: list[Trial] = field(default_factory=list)
    verified: set[str] = field(default_factory=set)
    """Keys of trials whose settled verdict was checked against a final backend record."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def faults(self) -> list[str]:
        """The faults the calls before each round's crash meet."""
        return [*BACKEND_FAULTS, *SLOW_FAULTS, *(STORE_FAULTS if self.plug else ())]

    def config(self, workdir: Path | None = None, port: int | None = None) -> Path:
        store_url = through(self.plug, self.store_url) if self.plug else self.store_url
        # One principal makes every call, in bursts of re-sends: a rate-limited re-send would read as
        # a call that did not join its first. The campaign is about effects, not the limit.
        overrides: dict[str, Any] = {"workers": WORKERS, "rate_limits": {"enabled": False}}
        if PARTITION_BY != "none":  # `run.py --partition-by tenant`: the log's heads per tenant
            overrides["store"] = {"url": store_url, "log": {"partition_by": PARTITION_BY}}
        return demo_config(
            workdir or self.workdir,
            gateway_port=port or self.port,
            backend_url=self.backend.url,
            store_url=store_url,
            timeout_s=TIMEOUT_S,
            commit_horizon_s=HORIZON_S,
            overrides=overrides,
        )

    def token(self, workdir: Path | None = None, port: int | None = None) -> str:
        url = f"http://127.0.0.1:{port or self.port}"
        issuer = DevIssuer.load_or_create((workdir or self.workdir) / "dev-issuer.jwk", f"{url}/dev-issuer")
        return issuer.mint(subject="agent-1", audience=f"{url}/mcp", tenant="acme", roles=["agent"])

    @contextlib.contextmanager
    def gateway(
        self, workdir: Path | None = None, port: int | None = None, **faults: str
    ) -> Iterator[subprocess.Popen[Any]]:
        workdir, port = workdir or self.workdir, port or self.port
        env = {k: v for k, v in os.environ.items() if k not in (CRASH_ENV, STOP_ENV)} | faults
        log = (workdir / "writ.log").open("a")
        process = subprocess.Popen(
            [*WRIT, "serve", "-c", str(self.config(workdir, port))],
            cwd=workdir,
            env=env,
            stdout=log,
            stderr=log,
        )
        try:
            # A campaign starts a gateway per round; on a shared machine at load 10, one start took
            # longer than the harness's 30 s: a bounded wait, generous, not a speed.
            wait_http(f"http://127.0.0.1:{port}/healthz", process, timeout_s=180)
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

    async def run_slow(self, target: int, replicas: int = 1) -> None:
        """`target` calls meeting the slow faults only, through `replicas` gateways on one store, the
        first send through one and the re-send through the next; no crash. Then settle every call."""
        with contextlib.ExitStack() as stack:
            clients, urls = [], []
            async with contextlib.AsyncExitStack() as clients_stack:
                for n in range(replicas):
                    workdir, port = self.workdir / f"replica-{n}", free_port()
                    workdir.mkdir(exist_ok=True)
                    stack.enter_context(self.gateway(workdir, port))
                    url, token = f"http://127.0.0.1:{port}/mcp", self.token(workdir, port)
                    urls.append((url, token))
                    clients.append(
                        await clients_stack.enter_async_context(mcp_client(url, token, mode="2026-07-28"))
                    )
                for n in range(target):
                    trial = Trial(f"s{n}", SLOW_FAULTS[n % len(SLOW_FAULTS)])
                    self.trials.append(trial)
                    await self._slow_call(clients[n % replicas], clients[(n + 1) % replicas], trial, n)
                    self.check_verdicts()
            # No crash was armed: the first replica, running all along, is the fault-free gateway.
            await self._settle(*urls[0])

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
                        if label in SLOW_FAULTS:
                            # No re-send now: a second dispatch would shift the count the crash is armed at.
                            await self._slow_call(client, None, trial, number * 7 + i)
                        elif label in STORE_FAULTS:
                            told = await self._call_with_store_cut(client, trial.key, process)
                            trial.tool_call_id, trial.status = told
                        else:
                            told = await self._call(client, trial.key, expect_answer=not crashing)
                            trial.tool_call_id, trial.status = told
                        self.check_verdicts()
            except Exception:  # the client's transport also fails on the way out once the server died
                if not crashing:
                    raise
            with anyio.fail_after(10):
                while process.poll() is None:
                    await anyio.sleep(0.02)
            assert process.returncode == 137, f"round {number}: expected the crash at {env[CRASH_ENV]}"
        self.backend.chaos()

    async def _call(
        self, client: Any, key: str | None, *, expect_answer: bool, arguments: dict[str, Any] | None = None
    ) -> tuple[str | None, str | None]:
        """The call with the client's key `key`, or with none (then `arguments`, unique to the trial)."""
        meta = {"writ/idempotencyKey": key} if key is not None else None
        try:
            with anyio.fail_after(15):
                result = await client.call_tool("refund_order", arguments or ARGS, meta=meta)
        except Exception:  # the gateway died mid-call: the client hears nothing (or a transport error)
            if expect_answer:
                raise
            return None, None
        told = result.meta or {}
        return told.get("writ/toolCallId"), told.get("writ/status")

    async def _slow_call(self, client: Any, resend_client: Any | None, trial: Trial, n: int) -> None:
        """A call without a key that meets a backend slow before it commits; with `resend_client`, the
        model re-sends the identical call through it as soon as it hears back."""
        trial.arguments = {**ARGS, "reason": f"fault campaign {trial.key}"}
        if trial.point == SLOW_FAULTS[0]:
            self.backend.chaos(commit_delay_ms=HOLDS_MS[n % len(HOLDS_MS)])
            told = await self._call(client, None, expect_answer=True, arguments=trial.arguments)
        else:
            self.backend.chaos(freeze=1)
            told = await self._call_with_backend_frozen(
                client, trial.arguments, FREEZES_MS[n % len(FREEZES_MS)]
            )
        self.backend.chaos()
        trial.tool_call_id, trial.status = told
        assert trial.tool_call_id is not None, trial
        with Store.open(self.store_url) as store:
            call = store.get_call(trial.tool_call_id)
        assert call is not None and call.key_source == "derived", call
        trial.key = call.idempotency_key
        if resend_client is not None:
            again, _ = await self._call(resend_client, None, expect_answer=True, arguments=trial.arguments)
            trial.resends.append(again)

    async def _call_with_backend_frozen(
        self, client: Any, arguments: dict[str, Any], freeze_ms: int
    ) -> tuple[str | None, str | None]:
        """The call, with the backend frozen (it SIGSTOPs itself once it has read the refund, before it
        runs it) and woken (SIGCONT) `freeze_ms` later: alive, the request delivered, nothing runs."""
        told: list[tuple[str | None, str | None]] = []

        async def call() -> None:
            told.append(await self._call(client, None, expect_answer=True, arguments=arguments))

        pid = self.backend.process.pid
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                with anyio.fail_after(15):
                    while not stopped(pid):
                        await anyio.sleep(0.01)
                await anyio.sleep(freeze_ms / 1000)  # the fault itself, not a wait for something
                os.kill(pid, signal.SIGCONT)
        finally:
            os.kill(pid, signal.SIGCONT)  # whatever failed, never leave the backend frozen
        return told[0]

    def check_verdicts(self) -> None:
        """No settled verdict contradicts the backend's own record: checked for every trial once its
        call is settled and no refund of its key is still queued (the backend's record is final)."""
        held = set(self.backend.held())
        with Store.open(self.store_url) as store:
            for trial in self.trials:
                if trial.key in self.verified or any(sent_for(sent, trial.key) for sent in held):
                    continue
                if trial.arguments is not None and trial.tool_call_id is None:
                    continue  # not sent yet
                call = (
                    store.get_call(trial.tool_call_id)
                    if trial.arguments is not None and trial.tool_call_id
                    else store.find_call_by_key("acme", "agent-1", trial.key)
                )
                if call is None or call.status not in FINAL:
                    continue
                trial.contradicted |= (call.status == "completed") != (self._effects_of(call, trial.key) > 0)
                self.verified.add(trial.key)

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
                # Bounded well past PostgreSQL's idle-in-transaction timeout (15 s), which ends a session
                # a cut left holding the log head: a call queued behind it reaches its point after that.
                with anyio.fail_after(60):
                    while not stopped(process.pid):
                        await anyio.sleep(0.01)
                self.plug.pull()
                os.kill(process.pid, signal.SIGCONT)
        finally:
            self.plug.plug_in()
        return told[0]

    async def settle(self, token: str, deadline_s: float = 60.0) -> None:
        """Run a fault-free gateway until nothing is dispatching or awaiting reconciliation."""
        with self.gateway():
            await self._settle(f"{self.url}/mcp", token, deadline_s)

    async def _settle(self, mcp_url: str, token: str, deadline_s: float = 60.0) -> None:
        """Wait, with a fault-free gateway at `mcp_url` running, until nothing is dispatching or awaiting
        reconciliation; then re-send every call through it and check every verdict."""
        with Store.open(self.store_url) as store:
            with anyio.fail_after(deadline_s):
                while any(
                    c.status == "dispatching" or (c.status == "result_unknown" and not c.escalated)
                    for c in store.list_calls(limit=100_000)
                ):
                    await anyio.sleep(0.2)
            # A client that re-sends a call it never heard back about joins the recorded call; a model
            # that re-sends a call without a key once the first one has a verdict must join it too.
            async with mcp_client(mcp_url, token, mode="2026-07-28") as client:
                for trial in self.trials:
                    if trial.arguments is not None and trial.tool_call_id is not None:
                        sent = store.get_call(trial.tool_call_id)
                        assert sent is not None
                        # Joining is promised within the call's dedupe window; a long campaign reaches
                        # its first trials after it, when an identical call is a new intent.
                        window = timedelta(seconds=sent.dedupe_window_s - 60)
                        if datetime.now(UTC) - sent.created_at.replace(tzinfo=UTC) < window:
                            again, _ = await self._call(
                                client, None, expect_answer=True, arguments=trial.arguments
                            )
                            trial.resends.append(again)
                    elif trial.point in POINTS:
                        again, _ = await self._call(client, trial.key, expect_answer=True)
                        call = store.find_call_by_key("acme", "agent-1", trial.key)
                        assert call is not None and again == call.tool_call_id, trial
            with anyio.fail_after(deadline_s):
                while self.backend.held():  # the late refunds of the re-sends, if any were dispatched
                    await anyio.sleep(0.1)
            self.check_verdicts()

    def report(self) -> dict[str, dict[str, int]]:
        """Per fault: trials, trials whose effect happened, duplicates (two effects for the key, or a
        re-send of a call without a key that did not join it), lost intents, unresolved, and wrong
        verdicts (the log says completed but the backend has no effect, or the reverse, at the end or
        after any trial; or the client was told a final status that the dispatch did not record)."""
        table: dict[str, dict[str, int]] = {}
        with Store.open(self.store_url) as store:
            for trial in self.trials:
                row = table.setdefault(
                    trial.point,
                    {"trials": 0, "effects": 0, "duplicates": 0, "lost": 0, "unresolved": 0, "wrong": 0},
                )
                row["trials"] += 1
                effects = len(self.backend.refunds(trial.key))
                call = (
                    store.get_call(trial.tool_call_id)
                    if trial.arguments is not None and trial.tool_call_id
                    else store.find_call_by_key("acme", "agent-1", trial.key)
                )
                row["effects"] += effects > 0
                # A re-send without a key must join the call, unless that call failed: a `failed` frees
                # its key (under load, a dispatch lease can run out before the request left), and the
                # re-send is then a new call of its own. Two effects are a duplicate whatever the log says.
                joins = call is None or call.status != "failed"
                row["duplicates"] += effects > 1 or (
                    joins and any(again != trial.tool_call_id for again in trial.resends)
                )
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
                own = self._effects_of(call, trial.key)
                row["wrong"] += (call.status == "completed") != (own == 1) or told_wrong or trial.contradicted
        return table

    def _effects_of(self, call: CallView, key: str) -> int:
        """The refunds under `key` that are `call`'s own: each names the request id it was sent with
        (its re-sends keep it). A call without a key shares its derived key with a later identical call
        once it failed (its key freed), whose refund is that call's, not this one's."""
        return sum(
            refund.get("request_id") in (None, call.external_request_id)
            for refund in self.backend.refunds(key)
        )


def explain(campaign: Campaign, fault: str) -> str:
    """The log of each trial of `fault` whose re-send did not join or whose verdict was contradicted:
    what an assertion message needs to tell a real defect from a test's."""
    lines = []
    with Store.open(campaign.store_url) as store:
        for trial in campaign.trials:
            if trial.point != fault or not (trial.contradicted or set(trial.resends) - {trial.tool_call_id}):
                continue
            lines.append(f"{trial}: {len(campaign.backend.refunds(trial.key))} refunds")
            for call_id in {trial.tool_call_id, *trial.resends} - {None}:
                for event in store.events(tool_call_id=call_id):
                    lines.append(f"  {event.type} {event.occurred_at} {event.payload}")
    return "\n".join(lines)


def format_table(table: dict[str, dict[str, int]]) -> str:
    columns = ("trials", "effects", "duplicates", "lost", "unresolved", "wrong")
    lines = [f"{'fault':<36}" + "".join(f"{c:>12}" for c in columns)]
    order = [
        *POINTS,
        *BACKEND_FAULTS,
        *SLOW_FAULTS,
        *STORE_FAULTS,
    ]  # the crashes first, then the faults in between
    for name, row in sorted(table.items(), key=lambda item: order.index(item[0])):
        lines.append(f"{name:<36}" + "".join(f"{row[c]:>12}" for c in columns))
    totals = {c: sum(row[c] for row in table.values()) for c in columns}
    lines.append(f"{'total':<36}" + "".join(f"{totals[c]:>12}" for c in columns))
    return "\n".join(lines)
