"""The gateway under test, whole: acme-payments and `writ serve` as real processes, talked to over real
HTTP, and `writ` run as a process or in this process.

`Gateway` is what a case asks of a gateway (tokens, an MCP client, the CLI, what the store recorded);
`writ_gateway` gives one that is a `writ serve` process, `tests/gateway/mcp/inproc.py` one that runs in
this process, so a module moves between the two by its fixtures, not its cases.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import ssl
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Any

import httpx2
import yaml
from click.testing import CliRunner
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from bench.processes import free_port, wait_http
from gateway.auth.dev_issuer import DevIssuer
from gateway.cli.main import main as writ_main
from gateway.config import WritConfig, load_config
from gateway.opening import dev_issuer_for, open_store
from store import Store
from store.model import CallView

REPO = Path(__file__).resolve().parents[2]
WRIT = [str(Path(sys.executable).parent / "writ")]

TLS = ssl.create_default_context()
"""The CA bundle loaded once: an httpx2 client made without `verify` (each `httpx2.get`, each MCP
client) loads it again, 20 to 100 ms of CPU, which the suite paid on every session and every probe."""

QUICK_LEASE_MARGIN_S = 3.0
"""The lease margin of gateways whose tests settle unknown refunds in seconds rather than minutes.

A dispatch is sent only while its lease still covers it, and the lease counts from when the call was
prepared, before its policy ran and its admission committed. A margin of 1 s was too little on a
loaded CI machine (three workers on two cores): a hung refund was answered `failed` where the test
needed it sent and unknown, which is what a call refused unsent (`lease_expired_before_dispatch`)
truthfully answers. Three seconds keep the waits short and outlast such a stall."""

QUICK_WORKERS = {
    "interval_s": 0.5,
    "executor_grace_s": 0.3,
    "lease_margin_s": QUICK_LEASE_MARGIN_S,
    "reconcile_backoff_s": 0.5,
}
"""Workers that settle an unknown refund in seconds: a lookup, a backoff, a lease run out the same way
at 0.5 s as at 5 s."""


@contextlib.asynccontextmanager
async def mcp_client(url: str, token: str, mode: str = "auto", **kwargs: Any) -> AsyncIterator[Client]:
    """The official MCP client over streamable HTTP, with a bearer token; closes its HTTP client too."""
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30, verify=TLS) as http,
        Client(streamable_http_client(url, http_client=http), mode=mode, **kwargs) as client,
    ):
        yield client


def wait_listening(port: int, process: subprocess.Popen[Any], timeout_s: float = 120.0) -> None:
    """Wait until something accepts TCP connections on 127.0.0.1:port."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"process exited with {process.returncode} before port {port} listened")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listened on port {port} within {timeout_s}s")


def stop(process: subprocess.Popen[Any]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


SCOPE_TAG = re.compile(r"~[0-9a-f]{20}")
"""What Writ appends to a client's key before a backend gets it (`store.keys.scoped_key`)."""


def sent_for(sent: str, key: str) -> bool:
    """Whether `sent`, a key as a backend got it, is the client's `key`: scoped to whichever principal
    sent it (`<key>~<tag>`), or as it came, as a call dispatched before keys were scoped sent it."""
    return sent == key or (sent.startswith(key) and SCOPE_TAG.fullmatch(sent, len(key)) is not None)


@dataclass
class Backend:
    """acme-payments over HTTP, wherever it runs."""

    url: str

    def refunds(self, key: str | None = None) -> list[dict[str, Any]]:
        """Executed refunds, oldest first; with `key`, those sent under the client's key `key`, by any
        principal (each principal's went out under a key of its own: `refunds_sent` asks for one)."""
        every = self.refunds_sent()
        return every if key is None else [r for r in every if sent_for(r["idempotency_key"], key)]

    def refunds_sent(self, sent: str | None = None) -> list[dict[str, Any]]:
        """Executed refunds under exactly the key `sent` as the backend got it (all without one)."""
        params = {"idempotency_key": sent} if sent is not None else None
        return httpx2.get(f"{self.url}/refunds", params=params, timeout=5, verify=TLS).json()["refunds"]

    def chaos(self, **settings: int) -> None:
        httpx2.post(f"{self.url}/_chaos", json=settings, timeout=5, verify=TLS).raise_for_status()

    def held(self) -> list[str]:
        """The keys of refunds the backend holds (`commit_delay_ms`), read and not yet committed."""
        held: list[str] = httpx2.get(f"{self.url}/_chaos/held", timeout=5, verify=TLS).json()["held"]
        return held


@dataclass
class BackendProcess(Backend):
    """acme-payments as a process of its own (`python -m demo.acme_payments`)."""

    process: subprocess.Popen[Any]


@contextlib.contextmanager
def backend_process(module: str, *arguments: str, cwd: Path = REPO) -> Iterator[BackendProcess]:
    """`python -m <module> --port <free port> <arguments>`, once it answers `GET /healthz`; stopped after."""
    port = free_port()
    command = [sys.executable, "-m", module, "--port", str(port), *arguments]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, cwd=cwd)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/healthz", process)
        yield BackendProcess(url, process)
    finally:
        stop(process)


@contextlib.contextmanager
def acme_backend(workdir: Path, *, dedupe: bool = False, db: str = "acme.db") -> Iterator[BackendProcess]:
    """acme-payments as a process; with `dedupe`, one that deduplicates on the key (`--dedupe`)."""
    arguments = ["--db", str(workdir / db), *(["--dedupe"] if dedupe else [])]
    with backend_process("demo.acme_payments", *arguments, cwd=workdir) as backend:
        yield backend


def demo_config(
    workdir: Path,
    *,
    gateway_port: int,
    backend_url: str,
    store_url: str,
    timeout_s: float = 2.0,
    commit_horizon_s: float | None = None,
    auth: dict[str, Any] | None = None,
    server: dict[str, Any] | None = None,
    overrides: dict[str, Any] | None = None,
    extra_backends: dict[str, Any] | None = None,
    extra_rules: list[dict[str, Any]] | None = None,
    budgets: list[dict[str, Any]] | None = None,
    loops: list[dict[str, Any]] | None = None,
    capabilities: dict[str, dict[str, Any]] | None = None,
) -> Path:
    """The demo's config for these ports and store, with short backend timeouts so tests stay quick
    (the commit horizon, unless given, twice the timeout).

    `auth` and `server` entries are merged over the demo's sections of that name (e.g. extra issuers,
    required scopes; timeouts, a public URL); `overrides` replace whole top-level sections (e.g.
    `policy_file`); `extra_backends` and `extra_rules` are added to the demo's backends and policy rules;
    `budgets` and `loops` replace the demo's budget and loop rules, which are left out
    unless given: cases of a module share principals and repeat calls on purpose (test_mcp_loops.py
    runs loop rules of its own, and checks the demo turns its rules on). `capabilities` maps a demo
    capability's id to settings merged over it (e.g. `{"refund-order": {"dedupes_on_key": True}}`).
    """
    template = Template((REPO / "demo" / "demo.yaml").read_text())
    backend_port = backend_url.rsplit(":", 1)[1]
    config = yaml.safe_load(
        template.safe_substitute(gateway_port=gateway_port, backend_port=backend_port, state_dir=workdir)
    )
    config["store"]["url"] = store_url
    config["auth"]["dev_issuer"]["key_file"] = str(workdir / "dev-issuer.jwk")
    config["privacy"]["salt_file"] = str(workdir / "redaction.salt")
    config["auth"].update(auth or {})
    config["server"].update(server or {})
    config.update(overrides or {})
    config["backends"].update(extra_backends or {})
    if extra_rules:
        config["policy"]["rules"] += extra_rules
    # Like the loop rules, the demo's budget is left out unless given: cases share principals.
    config["policy"]["budgets"] = budgets or []
    config["policy"]["loops"] = loops or []
    config["backends"]["acme"]["timeout_s"] = timeout_s
    config["backends"]["acme"]["commit_horizon_s"] = commit_horizon_s or 2 * timeout_s
    for capability in config["capabilities"]:
        capability["timeout_s"] = timeout_s
        capability.update((capabilities or {}).get(capability["id"], {}))
    path = workdir / "writ.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def writ(
    *args: str, cwd: Path, env: dict[str, str] | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """`writ ARGS` as a process: for what only a process shows (its start-up, its imports, a crash)."""
    return subprocess.run(
        [*WRIT, *args],
        cwd=cwd,
        # A $WRIT_TOKEN of whoever runs the tests must not decide for the CLI under test.
        env={**{k: v for k, v in os.environ.items() if k != "WRIT_TOKEN"}, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=check,
    )


# One run of the CLI in this process at a time: it owns the process's stdio, environment and directory.
_IN_PROCESS = threading.Lock()


def writ_inproc(
    *args: str, cwd: Path, env: dict[str, str] | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """`writ ARGS` run by the CLI's own `main` in this process, with `writ()`'s contract: the exit code,
    stdout and stderr as text, `env` over the environment (less the caller's $WRIT_TOKEN) and `cwd` as
    the directory for this run only; `check` raises CalledProcessError as `subprocess.run` does.

    A `writ` process costs over a second of CPU, importing what this process has imported already.
    `main` runs in a thread of its own, so a command that runs an event loop (`anyio.run`) may be called
    from an async test, whose loop is then blocked as a process call blocks it; stdio is click's test
    isolation (stdin empty, stdout and stderr captured, what `main` logs on the captured stderr).
    """
    code: list[int] = []

    def run() -> None:
        try:
            writ_main(list(args))
        except SystemExit as exc:  # what the interpreter would make of it, leaving the process
            if exc.code is None or isinstance(exc.code, int):
                code.append(exc.code or 0)
            else:
                print(exc.code, file=sys.stderr)
                code.append(1)
        except Exception:  # a process would die of it, printing the traceback
            traceback.print_exc()
            code.append(1)
        else:
            code.append(0)

    with _IN_PROCESS, CliRunner().isolation(env={"WRIT_TOKEN": None, **(env or {})}) as (stdout, stderr, _):
        before = Path.cwd()
        os.chdir(cwd)
        try:
            thread = threading.Thread(target=run, name="writ " + " ".join(args[:2]))
            thread.start()
            thread.join()
        finally:
            os.chdir(before)
            sys.stdout.flush()
            sys.stderr.flush()
        out, err = stdout.getvalue().decode(), stderr.getvalue().decode("utf-8", "backslashreplace")
    done = subprocess.CompletedProcess(["writ", *args], code[0], out, err)
    if check:
        done.check_returncode()
    return done


@dataclass
class Gateway:
    """A running gateway as a case sees it, wherever it runs: its URL, config file and directory, tokens
    from its dev issuer, the official MCP client, the CLI, and what its store recorded."""

    url: str
    config: Path
    workdir: Path

    @property
    def mcp_url(self) -> str:
        return f"{self.url}/mcp"

    def token(self, sub: str, roles: str = "agent", tenant: str = "acme") -> str:
        """A token from the gateway's dev issuer, minted as `writ token` mints it but in this process:
        a `writ` process per token cost more than most tests (`writ token` itself is tested in
        gateway/cli/test_cli_token.py and e2e/test_cli.py)."""
        config, issuer = self.issuing()
        assert issuer is not None, "the demo config turns the dev issuer on"
        return issuer.mint(
            subject=sub,
            audience=config.server.resource_url,
            tenant=tenant,
            roles=[r.strip() for r in roles.split(",") if r.strip()],
            ttl_s=config.auth.dev_issuer.token_ttl_s,
        )

    def issuing(self) -> tuple[WritConfig, DevIssuer | None]:
        """The gateway's config, as loaded from its file, and its dev issuer."""
        config = load_config(self.config)
        return config, dev_issuer_for(config)

    @contextlib.contextmanager
    def store(self) -> Iterator[Store]:
        """The gateway's own store, opened in this process for as long as the block runs."""
        store = open_store(load_config(self.config), migrate_empty=False)
        try:
            yield store
        finally:
            store.close()

    def recorded_calls(self) -> list[CallView]:
        """The calls `writ calls list` shows (the newest 100), read through the gateway's own store in
        this process: what a case compares before and after, at no process."""
        with self.store() as store:
            return store.list_calls()

    def event_types(self, tool_call_id: str) -> list[str]:
        """The types of a call's events, in order (what `writ calls show` lists)."""
        with self.store() as store:
            return [event.type for event in store.events(tool_call_id=tool_call_id)]

    def exported(self) -> str:
        """The log as `writ audit export` writes it, read through the gateway's own store in this
        process: for cases about what was recorded, not about the CLI (tested in e2e/test_cli.py)."""
        with self.store() as store:
            return "".join(json.dumps(e, sort_keys=True, default=str) + "\n" for e in store.export())

    def client(self, token: str, mode: str = "auto", **kwargs: Any) -> AbstractAsyncContextManager[Client]:
        return mcp_client(self.mcp_url, token, mode=mode, **kwargs)

    def cli(
        self, *args: str, check: bool = True, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """`writ ARGS -c CONFIG` in the gateway's directory, run in this process (`writ_inproc`); the CLI
        as a process is `writ()`, for e2e/test_cli.py's cases about the process."""
        return writ_inproc(*args, "-c", str(self.config), cwd=self.workdir, check=check, env=env)


@dataclass
class GatewayProcess(Gateway):
    """A `writ serve` process."""

    process: subprocess.Popen[Any]


@contextlib.contextmanager
def writ_gateway(workdir: Path, backend: Backend, store_url: str, **config: Any) -> Iterator[GatewayProcess]:
    port = free_port()
    path = demo_config(workdir, gateway_port=port, backend_url=backend.url, store_url=store_url, **config)
    log = (workdir / "writ.log").open("w")
    process = subprocess.Popen(
        [*WRIT, "serve", "-c", str(path)], cwd=workdir, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/healthz", process)
        yield GatewayProcess(url, path, workdir, process)
    finally:
        stop(process)
        log.close()
