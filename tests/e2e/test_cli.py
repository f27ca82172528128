"""The `writ` command line against a real store: audit, export, rebuild, stdio, and the demo."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import socket
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx2
import pytest
import yaml
from mcp import Client, StdioServerParameters

from store.packing import pack, unpack
from tests.e2e.harness import (
    WRIT,
    Backend,
    Gateway,
    acme_backend,
    demo_config,
    free_port,
    mcp_client,
    stop,
    wait_http,
    writ,
)
from tests.eventually import eventually_sync

pytestmark = pytest.mark.e2e


# The cases that only read the log, rebuild it or call through `writ stdio` share one gateway and
# backend on SQLite (their calls keep apart by key and by run); the case that edits the log has its own.
@pytest.fixture
def shared_gateway(module_sqlite_gateway: Gateway) -> Gateway:
    return module_sqlite_gateway


@pytest.fixture
def shared_backend(module_sqlite_backend: Backend) -> Backend:
    return module_sqlite_backend


def make_some_calls(gateway: Gateway) -> list[str]:
    async def calls() -> list[str]:
        async with gateway.client(gateway.token("alice")) as client:
            results = [
                await client.call_tool("lookup_order", {"order_id": "1001"}),
                await client.call_tool(
                    "refund_order", {"order_id": "1001", "amount": 5, "currency": "EUR", "reason": "test"}
                ),
                await client.call_tool(
                    "refund_order",
                    {"order_id": "1002", "amount": 500, "currency": "EUR", "reason": "test"},
                    meta={"writ/runId": "cli"},  # the others are in no run (2026-07-28 has no session)
                ),
            ]
            return [r.meta["writ/toolCallId"] for r in results]

    return anyio.run(calls)


def test_audit_verify_passes_on_a_clean_log_and_names_the_first_edited_seq(sqlite_gateway: Gateway) -> None:
    make_some_calls(sqlite_gateway)
    # `writ` as a process, for the exit codes a script or a supervisor sees (Gateway.cli runs it in this
    # process).
    config = ("-c", str(sqlite_gateway.config))
    clean = writ("audit", "verify", *config, cwd=sqlite_gateway.workdir)
    assert clean.returncode == 0 and clean.stdout.startswith("ok:")

    # Payloads are stored packed (store.packing): the attacker unpacks one, edits it and packs it again.
    db = sqlite3.connect(sqlite_gateway.workdir / "writ.db")
    with db:
        seq, text = next(
            (seq, unpack(stored))
            for seq, stored in db.execute("SELECT seq, payload FROM events ORDER BY seq")
            if '"amount":5,' in unpack(stored)
        )
        db.execute(
            "UPDATE events SET payload = ? WHERE seq = ?",
            (pack(text.replace('"amount":5,', '"amount":500,')), seq),
        )
    db.close()
    tampered = writ("audit", "verify", *config, cwd=sqlite_gateway.workdir, check=False)
    assert tampered.returncode == 1
    assert f"first bad seq {seq} (edited)" in tampered.stderr


def test_audit_export_writes_every_event_as_a_json_line_in_order(shared_gateway: Gateway) -> None:
    make_some_calls(shared_gateway)
    lines = shared_gateway.cli("audit", "export").stdout.splitlines()
    events = [json.loads(line) for line in lines]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    types = {e["type"] for e in events}
    assert {
        "run.started",
        "tool_call.requested",
        "tool_call.dispatching",
        "tool_call.completed",
        "approval.required",
    } <= types
    assert all(e["hash"] and e["prev_hash"] for e in events)


def test_store_rebuild_reproduces_the_calls_from_the_log_alone(shared_gateway: Gateway) -> None:
    ids = make_some_calls(shared_gateway)
    before = [shared_gateway.cli("calls", "show", i).stdout for i in ids]
    assert "rebuilt projections from" in shared_gateway.cli("store", "rebuild").stdout
    after = [shared_gateway.cli("calls", "show", i).stdout for i in ids]
    assert after == before


def test_writ_stdio_serves_the_same_tools_to_a_local_client(
    shared_gateway: Gateway, shared_backend: Backend
) -> None:
    token = shared_gateway.token("alice")
    params = StdioServerParameters(
        command=WRIT[0],
        args=["stdio", "-c", str(shared_gateway.config)],
        env={**os.environ, "WRIT_TOKEN": token},
        cwd=str(shared_gateway.workdir),
    )

    async def session() -> list[str]:
        async with Client(params, mode="legacy") as client:
            names = {t.name for t in (await client.list_tools()).tools}
            assert {"lookup_order", "refund_order", "writ_call_status"} <= names
            result = await client.call_tool(
                "refund_order",
                {"order_id": "1001", "amount": 7, "currency": "EUR", "reason": "stdio"},
                meta={"writ/idempotencyKey": "via-stdio"},
            )
            assert result.meta["writ/status"] == "completed"
            looked = await client.call_tool("lookup_order", {"order_id": "1001"})
            return [result.meta["writ/runId"], looked.meta["writ/runId"]]

    first, second = anyio.run(session), anyio.run(session)
    assert len(shared_backend.refunds("via-stdio")) == 1
    # One run per `writ stdio` process: the client named none, the process is its session. (The second
    # process's refund joins the first's under the same key, and answers with that call's run.)
    assert first[0] == first[1] == second[0] != second[1]
    with shared_gateway.store() as store:
        run = store.get_run(first[0])
    assert run is not None and (run.origin, run.call_count) == ("session", 2)


def test_writ_stdio_without_a_token_says_what_is_missing(tmp_path: Path) -> None:
    result = writ("stdio", cwd=tmp_path, env={"WRIT_TOKEN": ""}, check=False)
    assert result.returncode == 2
    assert "WRIT_TOKEN" in result.stderr


@dataclass
class Demo:
    """`writ demo` as a process in a directory of its own, its output in `log`."""

    process: subprocess.Popen[bytes]
    port: int
    backend_port: int
    log: Path

    def output(self) -> str:
        return self.log.read_text()


@contextlib.contextmanager
def running_demo(tmp_path: Path) -> Iterator[Demo]:
    """`writ demo` on free ports, once it answers; stopped with SIGTERM after the block."""
    port, backend_port = free_port(), free_port()
    path = tmp_path / "demo.log"
    with path.open("w+") as log:
        process = subprocess.Popen(
            [*WRIT, "demo", "--port", str(port), "--backend-port", str(backend_port)],
            cwd=tmp_path,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_http(f"http://127.0.0.1:{port}/healthz", process)
            yield Demo(process, port, backend_port, path)
        finally:
            stop(process)


def test_writ_demo_runs_in_an_empty_directory_and_serves_a_real_refund(tmp_path: Path) -> None:
    with running_demo(tmp_path) as demo:
        output = demo.output()
        assert f"http://127.0.0.1:{demo.port}/mcp" in output
        token = re.search(r"Agent token.*\n\s+(\S+)", output).group(1)

        async def refund() -> dict:
            async with mcp_client(f"http://127.0.0.1:{demo.port}/mcp", token) as client:
                result = await client.call_tool(
                    "refund_order", {"order_id": "1001", "amount": 20, "currency": "EUR", "reason": "demo"}
                )
                return result.structured_content

        body = anyio.run(refund)
        assert body["status"] == "succeeded"
        refunds = httpx2.get(f"http://127.0.0.1:{demo.backend_port}/refunds", timeout=5).json()["refunds"]
        assert len(refunds) == 1
        assert (tmp_path / ".writ" / "writ.db").exists() and (
            tmp_path / ".writ" / "acme-payments.db"
        ).exists()
        verify = writ("audit", "verify", cwd=tmp_path)  # finds ./.writ/demo.yaml by itself
        assert verify.stdout.startswith("ok:")
        # The banner's commands work as pasted, from where the demo runs: no PATH, no guessing.
        pasted = re.search(r"Audit the log: (.+?) {2,}Ctrl-C", output).group(1)
        assert shlex.split(pasted)[0].endswith("/writ")
        ran = subprocess.run(pasted, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert ran.stdout.startswith("ok:"), ran.stdout + ran.stderr
        assert re.search(r"/writ approvals approve ID --reason \S+ --token <approver token>", output)
    # Stopped with SIGTERM (as a supervisor or `kill` does), the demo takes its backend down with it.
    assert demo.process.returncode != -signal.SIGKILL, "writ demo ignored SIGTERM"
    with pytest.raises(httpx2.ConnectError):
        httpx2.get(f"http://127.0.0.1:{demo.backend_port}/healthz", timeout=2)


def test_writ_demo_says_so_when_its_backend_dies(tmp_path: Path) -> None:
    # Killed (OOM, a stray kill), acme-payments left the demo answering every refund
    # backend_unreachable with nothing to say why.
    with running_demo(tmp_path) as demo:
        pid = demo.process.pid
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        [backend] = [int(p) for p in children if "acme_payments" in Path(f"/proc/{p}/cmdline").read_text()]
        os.kill(backend, signal.SIGKILL)
        said = f"acme-payments (port {demo.backend_port}) exited with code -9"
        eventually_sync(lambda: said in demo.output())
        assert demo.process.poll() is None  # the gateway still answers, and says why its calls fail
    assert "Stop the demo (Ctrl-C) and run `writ demo` again" in demo.output()


def test_a_read_command_in_a_directory_without_a_store_says_so(tmp_path: Path) -> None:
    result = writ("calls", "show", "tc_nothing", cwd=tmp_path, check=False)
    assert result.returncode == 2
    assert "nothing is recorded" in result.stderr and "writ demo" in result.stderr
    # ... and leaves no empty store behind, which the next one would then read as a store with nothing.
    for command in (
        ["approvals", "list"],
        ["audit", "verify"],
        ["audit", "export"],
        ["oauth", "clients", "list"],
    ):
        result = writ(*command, cwd=tmp_path, check=False)
        assert result.returncode != 0 and "nothing is recorded" in result.stderr, (command, result.stderr)
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_writ_demo_refuses_a_backend_port_something_else_listens_on(tmp_path: Path) -> None:
    # An acme-payments left behind (its demo was killed) answered the new demo's health check, so the
    # demo said it was running, against a backend it did not start, while its own one failed to bind.
    # Nor may the refusal rewrite ./.writ/demo.yaml, which a running demo's CLI and tokens read.
    (tmp_path / ".writ").mkdir()
    (tmp_path / ".writ" / "demo.yaml").write_text("# the running demo's\n")
    with acme_backend(tmp_path) as leftover:
        taken = leftover.url.rsplit(":", 1)[1]
        demo = subprocess.run(
            [*WRIT, "demo", "--port", str(free_port()), "--backend-port", taken],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert demo.returncode == 2
    assert f"port {taken} is in use" in demo.stderr and "--backend-port" in demo.stderr
    assert "Writ demo is running" not in demo.stdout
    assert (tmp_path / ".writ" / "demo.yaml").read_text() == "# the running demo's\n"


def test_writ_serve_with_an_upstream_it_cannot_reach_says_why_in_one_line(tmp_path: Path) -> None:
    # The upstream is asked for its tools at startup; failing, uvicorn printed ~120 lines of nested
    # tracebacks with the reason at the bottom.
    nowhere = free_port()
    path = demo_config(
        tmp_path,
        gateway_port=free_port(),
        backend_url=f"http://127.0.0.1:{free_port()}",
        store_url=f"sqlite:///{tmp_path / 'writ.db'}",
    )
    config = yaml.safe_load(path.read_text())
    config["backends"]["files"] = {"type": "mcp", "url": f"http://127.0.0.1:{nowhere}/mcp", "tools": "*"}
    path.write_text(yaml.safe_dump(config))
    result = writ("serve", "-c", str(path), cwd=tmp_path, check=False)
    assert result.returncode != 0
    assert "writ cannot start: mcp backend 'files': cannot connect" in result.stderr
    assert "Traceback" not in result.stderr, result.stderr


def test_writ_serve_on_a_port_already_taken_fails_without_saying_it_is_ready(tmp_path: Path) -> None:
    # "writ ready" was said in the app's lifespan, which uvicorn runs before it binds the port: the
    # log said ready, then "address already in use", and the process exited.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        path = demo_config(
            tmp_path,
            gateway_port=taken.getsockname()[1],
            backend_url=f"http://127.0.0.1:{free_port()}",
            store_url=f"sqlite:///{tmp_path / 'writ.db'}",
        )
        result = writ("serve", "-c", str(path), cwd=tmp_path, check=False)
    assert result.returncode == 3, result.stderr
    assert "address already in use" in result.stderr
    assert "writ ready" not in result.stdout + result.stderr


def test_a_command_whose_database_is_down_says_so_in_one_line(tmp_path: Path) -> None:
    path = demo_config(
        tmp_path,
        gateway_port=free_port(),
        backend_url=f"http://127.0.0.1:{free_port()}",
        store_url=f"postgresql://writ@127.0.0.1:{free_port()}/writ",
    )
    for command in (["calls", "list"], ["serve"]):
        result = writ(*command, "-c", str(path), cwd=tmp_path, check=False)
        assert result.returncode == 1
        # What Writ logged before it asked the store (the key files it made in this fresh directory)
        # aside, the error is one line.
        said = [line for line in result.stderr.splitlines() if " WARNING gateway.secret_files: " not in line]
        assert said[0].startswith("writ: the store: database unavailable"), result.stderr
        assert "Traceback" not in result.stderr


def test_a_demo_killed_with_sigkill_takes_its_backend_down_with_it(tmp_path: Path) -> None:
    # No `finally` runs on SIGKILL: acme-payments lived on holding its port, and the next demo could
    # not start (or, before it checked the port, talked to the leftover).
    port, backend_port = free_port(), free_port()
    process = subprocess.Popen(
        [*WRIT, "demo", "--port", str(port), "--backend-port", str(backend_port)],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", process)
        process.kill()
        process.wait(timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                httpx2.get(f"http://127.0.0.1:{backend_port}/healthz", timeout=1)
            except httpx2.TransportError:
                break
            time.sleep(0.1)
        else:
            pytest.fail("acme-payments still answers after its demo was killed")
    finally:
        stop(process)
