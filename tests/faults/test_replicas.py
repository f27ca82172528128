"""Several `writ serve` replicas on one PostgreSQL database: one effect per key, and takeover.

A replica killed (SIGKILL) or frozen (SIGSTOP) mid-dispatch is recovered by the other; a frozen one
that wakes after its lease cannot record or dispatch any more (DESIGN §3.5).

The cases share the database, the backend and the replica that takes over (`other`), each case with
keys of its own; the replica a case kills or freezes is its own.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest

from gateway.auth.dev_issuer import DevIssuer
from gateway.calls.faults import STOP_ENV
from store import CallView, Store
from tests.e2e.harness import WRIT, Backend, acme_backend, demo_config, free_port, mcp_client, stop, wait_http
from tests.faults.campaign import ARGS, TIMEOUT_S, WORKERS
from tests.postgres import fresh_schema

pytestmark = [pytest.mark.anyio, pytest.mark.e2e, pytest.mark.postgres]


class Replica:
    def __init__(self, workdir: Path, process: subprocess.Popen[Any], port: int) -> None:
        self.workdir, self.process, self.port = workdir, process, port
        self.url = f"http://127.0.0.1:{port}/mcp"
        issuer = DevIssuer.load_or_create(workdir / "dev-issuer.jwk", f"http://127.0.0.1:{port}/dev-issuer")
        self.token = issuer.mint(subject="agent-1", audience=self.url, tenant="acme", roles=["agent"])

    async def call(self, key: str) -> str | None:
        async with mcp_client(self.url, self.token, mode="2026-07-28") as client:
            result = await client.call_tool("refund_order", ARGS, meta={"writ/idempotencyKey": key})
            return result.meta["writ/status"]


@contextlib.contextmanager
def replica(
    root: Path, name: str, backend: Backend, store_url: str, command: Sequence[str] = WRIT, **env: str
) -> Iterator[Replica]:
    workdir = root / name
    workdir.mkdir()
    port = free_port()
    config = demo_config(
        workdir,
        gateway_port=port,
        backend_url=backend.url,
        store_url=store_url,
        timeout_s=TIMEOUT_S,
        overrides={"workers": WORKERS},
    )
    log = (workdir / "writ.log").open("w")
    process = subprocess.Popen(
        [*command, "serve", "-c", str(config)], cwd=workdir, env={**os.environ, **env}, stdout=log, stderr=log
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", process)
        yield Replica(workdir, process, port)
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGCONT)
        stop(process)
        log.close()


@pytest.fixture(scope="module")
def shared_url(postgres_url: str) -> Iterator[str]:
    with fresh_schema(postgres_url, "writ_rep") as url:
        with Store.open(url) as store:
            store.migrate()  # once, before the replicas start
        yield url


@pytest.fixture(scope="module")
def shared_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    with acme_backend(tmp_path_factory.mktemp("acme")) as b:
        yield b


@pytest.fixture(scope="module")
def other(
    tmp_path_factory: pytest.TempPathFactory, shared_backend: Backend, shared_url: str
) -> Iterator[Replica]:
    """The replica that stays up through every case: it serves, recovers and takes over."""
    with replica(tmp_path_factory.mktemp("replicas"), "b", shared_backend, shared_url) as b:
        yield b


@pytest.fixture
def backend(shared_backend: Backend) -> Iterator[Backend]:
    """The module's backend, its faults cleared after the case."""
    yield shared_backend
    shared_backend.chaos()


async def wait_for(store: Store, key: str, predicate: Any, timeout_s: float = 20) -> CallView:
    with anyio.fail_after(timeout_s):
        while True:
            call = store.find_call_by_key("acme", "agent-1", key)
            if call is not None and predicate(call):
                return call
            await anyio.sleep(0.05)


async def test_identical_calls_through_two_replicas_cause_one_effect(
    tmp_path: Path, backend: Backend, shared_url: str, other: Replica
) -> None:
    pg_url, b = shared_url, other
    statuses: list[str | None] = []

    async def call(through: Replica) -> None:
        statuses.append(await through.call("same-key"))

    with replica(tmp_path, "a", backend, pg_url) as a:
        async with anyio.create_task_group() as tg:
            for n in range(6):
                tg.start_soon(call, a if n % 2 else b)
        with Store.open(pg_url) as store:
            # A loaded machine may take longer than the capability's 0.5 s for the one refund: then the
            # calls truthfully answer result_unknown, and reconciliation confirms the refund it finds.
            settled = await wait_for(store, "same-key", lambda c: c.status in ("completed", "failed"))
    assert set(statuses) <= {"completed", "result_unknown"} and len(statuses) == 6, statuses
    assert settled.status == "completed", (settled.error, settled.result)
    assert len(backend.refunds("same-key")) == 1


async def test_a_replica_killed_mid_dispatch_is_recovered_and_reconciled_by_the_other(
    tmp_path: Path, backend: Backend, shared_url: str, other: Replica
) -> None:
    pg_url = shared_url
    backend.chaos(delay_ms=3000)  # the refund commits, the answer is slow
    with (
        replica(tmp_path, "a", backend, pg_url) as a,
        Store.open(pg_url) as store,
    ):
        async with anyio.create_task_group() as tg:
            tg.start_soon(a.call, "killed")
            await wait_for(store, "killed", lambda c: c.status == "dispatching")
            with anyio.fail_after(10):
                while not backend.refunds("killed"):
                    await anyio.sleep(0.05)
            a.process.kill()
            tg.cancel_scope.cancel()
        backend.chaos()
        call = await wait_for(store, "killed", lambda c: c.status in ("completed", "failed"))
    assert (call.status, call.verification_status) == ("completed", "confirmed_success")
    assert len(backend.refunds("killed")) == 1


@pytest.mark.parametrize(
    ("point", "status", "effects"),
    [("after_execute", "completed", 1), ("after_dispatching_commit", "failed", 0)],
    ids=["frozen-after-the-effect", "frozen-before-sending"],
)
async def test_a_replica_frozen_past_its_lease_is_taken_over_and_cannot_record_or_dispatch_after(
    tmp_path: Path,
    backend: Backend,
    shared_url: str,
    other: Replica,
    point: str,
    status: str,
    effects: int,
) -> None:
    pg_url, key = shared_url, f"frozen-{point}"
    with (
        replica(tmp_path, "a", backend, pg_url, **{STOP_ENV: f"{point}:1"}) as a,
        Store.open(pg_url) as store,
    ):
        answer: list[str | None] = []

        async def call_through_a() -> None:
            answer.append(await a.call(key))

        async with anyio.create_task_group() as tg:
            tg.start_soon(call_through_a)
            settled = await wait_for(store, key, lambda c: c.status in ("completed", "failed"))
            os.kill(a.process.pid, signal.SIGCONT)  # wakes up long past its lease
            with anyio.fail_after(20):
                while not answer:
                    await anyio.sleep(0.05)
        final = store.find_call_by_key("acme", "agent-1", key)
        events = [e.type for e in store.events(tool_call_id=final.tool_call_id)]
    assert settled.status == status and final == settled  # the woken replica recorded nothing
    assert answer == [status]
    assert len(backend.refunds(key)) == effects
    assert "tool_call.result_unknown" in events and "reconciliation.resolved" in events
    assert "tool_call.completed" not in events and "tool_call.failed" not in events


SKEWED = [sys.executable, str(Path(__file__).with_name("skewed_writ.py"))]
"""`writ`, on a host whose wall clock is off by $WRIT_TEST_CLOCK_SKEW_S seconds."""


async def test_a_replica_whose_clock_is_20_s_ahead_leaves_the_others_calls_in_flight_alone(
    tmp_path: Path, backend: Backend, shared_url: str, other: Replica
) -> None:
    """By its own clock every lease the other replica takes has run out, and every commit horizon has
    passed: it took the other's calls in flight for unknown, found nothing yet, and settled them failed,
    refunds that then landed. Business time is the database's, so it does not."""
    backend.chaos(commit_delay_ms=350)  # inside the 0.5 s timeout: after the skewed replica looks
    with replica(tmp_path, "skewed", backend, shared_url, SKEWED, WRIT_TEST_CLOCK_SKEW_S="20") as skewed:
        keys = [f"skew-{n}" for n in range(3)]
        # A loaded machine may take longer than the 0.5 s: then `result_unknown`, truthfully, and
        # reconciliation finds the refund. Never `failed`.
        statuses = [await other.call(key) for key in keys]
        own = await skewed.call("skew-own")
        with Store.open(shared_url) as store:
            calls = [await wait_for(store, key, lambda c: c.status != "result_unknown") for key in keys]
            mine = await wait_for(store, "skew-own", lambda c: c.status != "result_unknown")
            recorded = [
                datetime.fromisoformat(e.occurred_at) for e in store.events(tool_call_id=mine.tool_call_id)
            ]
    assert set(statuses) | {own} <= {"completed", "result_unknown"}, (statuses, own)
    assert [(c.status, c.contradicted) for c in calls] == [("completed", False)] * 3, [c.error for c in calls]
    assert all(len(backend.refunds(key)) == 1 for key in keys)
    # What the skewed replica records is stamped with the database's time, not its host's.
    assert recorded and all(abs((at - datetime.now(UTC)).total_seconds()) < 10 for at in recorded)
