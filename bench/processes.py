"""The processes a benchmark measures: acme-payments and `writ serve`, each a real process on localhost.

The gateway runs the demo configuration (auth on, events durable unless a scenario says otherwise),
pointed at a fresh backend and a fresh store: a SQLite file or a PostgreSQL schema of its own.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Any

import httpx2
import sqlalchemy as sa
import yaml

from bench import probes

REPO = Path(__file__).resolve().parents[1]
WRIT = str(Path(sys.executable).parent / "writ")
POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
_ports_handed_out: set[int] = set()
_ports_lock = threading.Lock()

_tree = REPO


def use_tree(tree: Path) -> None:
    """Run the gateway and backend from this source tree (e.g. a `git archive` of a commit) instead of
    the checkout the venv has installed, so a benchmark can compare two commits on the same machine."""
    global _tree
    _tree = tree.resolve()


def _env() -> dict[str, str]:
    if _tree == REPO:
        return dict(os.environ)
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(_tree), os.environ.get("PYTHONPATH")])),
    }


def free_port() -> int:
    """A port nothing listens on now, and that this process has not handed out before.

    Callers often take several ports before they start anything on them. Once a probe socket is
    closed the kernel may give its port to the next probe, so two of them could be one port: the
    second server would then find the first one's port taken, or an address meant to be
    unreachable would reach the gateway itself.
    """
    with _ports_lock:
        while True:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = int(s.getsockname()[1])
            if port not in _ports_handed_out:
                _ports_handed_out.add(port)
                return port


START_TIMEOUT_S = 180.0
"""How long `writ serve` may take to answer: its imports alone take a minute on a saturated machine."""


def wait_http(url: str, process: subprocess.Popen[Any], timeout_s: float = 120.0) -> None:
    """Wait until `url` answers 200, failing fast if the process died (the tests' harness uses it too)."""
    deadline = time.monotonic() + timeout_s
    # One client for every probe: a new one per probe loads the CA bundle again (20 to 100 ms of CPU,
    # taken from the process that is starting).
    with httpx2.Client(timeout=1.0) as http:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"process exited with {process.returncode} before {url} answered")
            try:
                if http.get(url).status_code == 200:
                    return
            except httpx2.TransportError:
                pass
            time.sleep(0.05)
    raise TimeoutError(f"{url} did not answer within {timeout_s}s")


def _stop(process: subprocess.Popen[Any]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@dataclass(frozen=True)
class Backend:
    url: str
    pid: int


@contextlib.contextmanager
def backend(workdir: Path) -> Iterator[Backend]:
    """A fresh acme-payments with its own SQLite file."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "demo.acme_payments" if (_tree / "demo").is_dir() else "gateway.demo.acme_payments",
            "--port",
            str(port),
            "--db",
            str(workdir / "acme.db"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=workdir,
        env=_env(),
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/healthz", process, timeout_s=START_TIMEOUT_S)
        yield Backend(url, process.pid)
    finally:
        _stop(process)


KEEP_SCHEMAS = False
"""Leave each PostgreSQL schema behind (for `bench/store_bytes.py --db`); `bench/run.py --keep-stores`."""


@contextlib.contextmanager
def store_url(kind: str, workdir: Path) -> Iterator[str]:
    """A fresh store URL: a SQLite file, or a PostgreSQL schema created here and dropped afterwards."""
    if kind == "sqlite":
        yield f"sqlite:///{workdir / 'writ.db'}"
        return
    if kind != "postgres":
        raise ValueError(f"unknown store {kind!r}: use sqlite or postgres")
    schema = f"writ_bench_{uuid.uuid4().hex[:10]}"
    engine = sa.create_engine(POSTGRES_URL.replace("postgresql://", "postgresql+psycopg://", 1))
    with engine.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield f"{POSTGRES_URL}?options=-csearch_path%3D{schema}"
    finally:
        if not KEEP_SCHEMAS:
            with engine.begin() as conn:
                conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        engine.dispose()


@dataclass(frozen=True)
class BareProxy:
    mcp_url: str
    pid: int


@contextlib.contextmanager
def bare_proxy(
    workdir: Path, backend_url: str | None = None, *, upstream_mcp: str | None = None
) -> Iterator[BareProxy]:
    """`bench.bare_proxy` in front of this backend (acme-payments over HTTP, or `upstream_mcp`): the MCP
    SDK stack with nothing of Writ's. Always this checkout's, even under `use_tree`: it is the yardstick."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    target = ["--upstream-mcp", upstream_mcp] if upstream_mcp else ["--backend", str(backend_url)]
    with (workdir / "bare-proxy.log").open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "bench.bare_proxy", "--port", str(port), *target],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(os.environ),
        )
        try:
            url = f"http://127.0.0.1:{port}"
            wait_http(f"{url}/healthz", process, timeout_s=START_TIMEOUT_S)
            yield BareProxy(f"{url}/mcp", process.pid)
        finally:
            _stop(process)


@dataclass(frozen=True)
class Gateway:
    url: str
    config: Path
    workdir: Path
    pid: int
    store_url: str = ""
    fsync_trace: Path | None = None
    """The strace log of the gateway's fsyncs (bench.probes), when it runs under strace."""

    @property
    def mcp_url(self) -> str:
        return f"{self.url}/mcp"

    def token(self, sub: str = "bench", roles: str = "agent", tenant: str = "acme") -> str:
        out = subprocess.run(
            [WRIT, "token", "--sub", sub, "--roles", roles, "--tenant", tenant, "-c", str(self.config)],
            cwd=self.workdir,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
            env=_env(),
        )
        return out.stdout.strip().splitlines()[-1]


POLICY_CHECK_BUDGETS: list[dict[str, Any]] = [
    # deploy/writ.example.yaml's two budgets, with limits far above any run's calls and spend.
    {"id": "agent-calls-per-hour", "roles": ["agent"], "scope": "principal", "window": "1h", "limit": 10**9},
    {
        "id": "refunds-per-day",
        "tools": ["refund_order"],
        "scope": "principal",
        "window": "1d",
        "measure": "spend",
        "amount": "double(args.amount)",
        "currency": "args.currency",
        "convert": {"to": "EUR", "rates": {"USD": 0.92, "GBP": 1.17}},
        "limit": 10**9,
    },
]
"""The budgets `policy_checks` turns on beside the demo's loop rules (in place of the demo's own)."""

LOOP_THRESHOLD_NO_RUN_REACHES = 100_000
"""The demo's loop rules' threshold when `policy_checks` turns them on (the most a rule may have)."""

UPSTREAM_MODE = "2026-07-28"
"""The protocol Writ speaks to the upstream MCP server: the bare proxy's (`bench.bare_proxy`)."""


def _config(
    workdir: Path,
    *,
    port: int,
    backend_url: str,
    store: str,
    durable: bool,
    json_response: bool | None,
    upstream_mcp: str | None = None,
    policy_checks: bool = False,
    secrets: Path | None = None,
    public_url: str | None = None,
) -> Path:
    demo = _tree / "demo" if (_tree / "demo").is_dir() else _tree / "gateway" / "demo"
    template = Template((demo / "demo.yaml").read_text())
    backend_port = backend_url.rsplit(":", 1)[1]
    config = yaml.safe_load(
        template.safe_substitute(gateway_port=port, backend_port=backend_port, state_dir=workdir)
    )
    if upstream_mcp is not None:
        # The same two tools, discovered from an upstream MCP server instead of declared over HTTP.
        # A refund's timeout is long: on a saturated machine a 5 s one ends a run with result_unknown.
        effects = {"lookup_order": {"effect": "read"}, "refund_order": {"effect": "write", "timeout_s": 30}}
        config["backends"] = {
            "upstream": {"type": "mcp", "url": upstream_mcp, "mode": UPSTREAM_MODE, "overrides": effects}
        }
        config["capabilities"] = []
    else:
        # The demo's 5 s to acme-payments, and its refunds' own, would end a run on a saturated
        # machine (the suite's first minute) as a failed read or an unknown refund: the benchmark
        # measures throughput, not timeouts. The horizon stays past the timeout, as Writ requires.
        # (Each setting only where the tree's demo has it: --tree may name one from before it.)
        for section in (*config.get("backends", {}).values(), *config.get("capabilities", [])):
            if "timeout_s" in section:
                section["timeout_s"] = 30
            if "commit_horizon_s" in section:
                section["commit_horizon_s"] = 45
    config["store"]["url"] = store
    config["store"]["durable"] = durable
    if policy_checks:
        if not config["policy"].get("loops"):
            raise ValueError(f"{demo / 'demo.yaml'} has no loop rules: policy checks need a tree with them")
        # The demo's loop rules, and budgets, with bounds no run reaches: every call pays the checks
        # (a mark per rule covering it, a budget count), none is refused (a refusal would be cheaper
        # than the call it stands for). The demo's near-identical refund rule leaves out all but the
        # order and currency, so a run's refunds are one pattern to it.
        for rule in config["policy"]["loops"]:
            rule["threshold"] = LOOP_THRESHOLD_NO_RUN_REACHES
        config["policy"]["budgets"] = POLICY_CHECK_BUDGETS
    else:
        # One principal makes the same refund hundreds of times by design (outside the MCP scenario,
        # with its distinct arguments): the demo's loop rules would stop it.
        config["policy"].pop("loops", None)
        config["policy"].pop("budgets", None)
    if json_response is not None:
        config["server"]["json_response"] = json_response
    # Replicas of one store share the development issuer's key (a token one signed, any accepts) and
    # the redaction salt (a redacted argument hashes alike on each), as a deployment's replicas do.
    config["auth"]["dev_issuer"]["key_file"] = str((secrets or workdir) / "dev-issuer.jwk")
    config["privacy"]["salt_file"] = str((secrets or workdir) / "redaction.salt")
    if public_url is not None:
        # One URL for all replicas, as behind a load balancer: the tokens' issuer and audience.
        config["server"]["public_url"] = public_url
    if any((_tree / "gateway" / p).exists() for p in ("rate_limits.py", "calls/rate_limits.py")):
        # One principal makes every call, hundreds a second: the benchmark measures the path, not
        # the limit (a tree from before rate limits would refuse the key).
        config["rate_limits"] = {"enabled": False}
    path = workdir / "writ.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@contextlib.contextmanager
def gateway(
    workdir: Path,
    backend_url: str,
    store: str,
    *,
    durable: bool = True,
    json_response: bool | None = None,
    upstream_mcp: str | None = None,
    trace_fsyncs: bool = False,
    policy_checks: bool = False,
    secrets: Path | None = None,
    public_url: str | None = None,
) -> Iterator[Gateway]:
    """`writ serve` on the demo config against this backend (or, with `upstream_mcp`, the demo's tools
    served by that upstream MCP server) and store; its log goes to workdir/writ.log. With
    `trace_fsyncs`, it runs under strace counting its fsyncs (where strace is installed). With
    `policy_checks`, the demo's loop rules and `POLICY_CHECK_BUDGETS` are on; without, neither is.
    Replicas of one store are gateways given the same `secrets` directory (the first one started makes
    its files) and the same `public_url` (the first one's URL)."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    path = _config(
        workdir,
        port=port,
        backend_url=backend_url,
        store=store,
        durable=durable,
        json_response=json_response,
        upstream_mcp=upstream_mcp,
        policy_checks=policy_checks,
        secrets=secrets,
        public_url=public_url,
    )
    trace = workdir / "fsyncs.strace"
    prefix = probes.strace_prefix(trace) if trace_fsyncs else []
    with (workdir / "writ.log").open("w") as log:
        process = subprocess.Popen(
            [*prefix, WRIT, "serve", "-c", str(path)],
            cwd=workdir,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=_env(),
        )
        try:
            url = f"http://127.0.0.1:{port}"
            wait_http(f"{url}/healthz", process, timeout_s=START_TIMEOUT_S)
            # Under strace, the gateway is strace's child: its CPU is what is measured.
            pid = probes.traced_child(process.pid) if prefix else process.pid
            yield Gateway(url, path, workdir, pid, store, trace if prefix else None)
        finally:
            if prefix:  # strace leaves its child running when it is stopped: stop the gateway first
                probes.stop_traced(process.pid)
            _stop(process)
