"""`writ demo`: the embedded default, end to end, in the current directory.

Starts acme-payments (a separate process with its own SQLite file) and the gateway on SQLite under
./.writ/, with the development issuer, then prints the MCP URL, tokens and how to connect clients.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from string import Template

import httpx2
import uvicorn

from gateway.app import build_app, build_runtime
from gateway.config import DEFAULT_STATE_DIR, DEMO_CONFIG, load_config
from gateway.errors import ConfigurationError
from gateway.serve import WritServer, uvicorn_config

AGENT = ("demo-agent", "agent")
APPROVER = ("demo-approver", "approver")
TENANT = "acme"


def write_demo_config(gateway_port: int, backend_port: int) -> Path:
    """Write ./.writ/demo.yaml for these ports and return its path. One edited since the demo wrote it
    is kept beside it as demo.yaml.bak, and the demo says so: each start writes the config afresh."""
    template = Template(resources.files("demo").joinpath("demo.yaml").read_text())
    DEFAULT_STATE_DIR.mkdir(mode=0o700, exist_ok=True)  # it will hold the store, the salt and the key
    text = template.safe_substitute(
        gateway_port=gateway_port, backend_port=backend_port, state_dir=DEFAULT_STATE_DIR.resolve()
    )
    written = DEFAULT_STATE_DIR / ".demo.yaml.written"  # what the demo wrote last, to tell edits apart
    if DEMO_CONFIG.exists() and written.exists() and DEMO_CONFIG.read_text() != written.read_text():
        kept = DEMO_CONFIG.replace(DEMO_CONFIG.with_name("demo.yaml.bak"))
        print(
            f"writ demo: {DEMO_CONFIG} was edited; kept as {kept} and written afresh (to run your own "
            "config, copy it to writ.yaml and use `writ serve`)",
            file=sys.stderr,
        )
    DEMO_CONFIG.write_text(text)
    written.write_text(text)
    return DEMO_CONFIG


def require_free_port(port: int, option: str, suspect: str) -> None:
    """Refuse to start on a port something already listens on.

    Otherwise the backend's health check would be answered by whatever holds the port (an
    acme-payments left behind by a demo that was killed, someone else's server) and the demo would
    say it is running against it.

    Raises:
        ConfigurationError: the port is taken.
    """
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            raise ConfigurationError(
                f"port {port} is in use ({exc.strerror}): stop what listens there ({suspect}?) "
                f"or pick another with {option}"
            ) from exc


def _die_with_parent(parent: int) -> Callable[[], None]:
    """In the child before exec: on Linux, have the kernel SIGTERM it when the demo dies.

    A demo killed with SIGKILL runs no `finally`, so its acme-payments lived on, held the port, and
    the next `writ demo` could not start its own.
    """

    def arm() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the demo died before the signal was armed
            os._exit(1)

    return arm


_PR_SET_PDEATHSIG = 1


def start_backend(port: int, timeout_s: float = 20.0) -> subprocess.Popen[bytes]:
    """Start acme-payments and wait until it answers /healthz.

    Raises:
        ConfigurationError: it exited or did not answer in time (port taken?).
    """
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "demo.acme_payments",
            "--port",
            str(port),
            "--db",
            str(DEFAULT_STATE_DIR / "acme-payments.db"),
        ],
        stdout=subprocess.DEVNULL,
        preexec_fn=_die_with_parent(os.getpid()) if sys.platform == "linux" else None,
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ConfigurationError(
                f"acme-payments exited with code {process.returncode} (is port {port} free?)"
            )
        try:
            if httpx2.get(f"http://127.0.0.1:{port}/healthz", timeout=1.0).status_code == 200:
                return process
        except httpx2.TransportError:
            pass
        time.sleep(0.1)
    process.terminate()
    raise ConfigurationError(f"acme-payments did not answer on port {port} within {timeout_s:.0f}s")


def banner(url: str, backend_url: str, agent_token: str, approver_token: str) -> str:
    writ = Path(sys.executable).parent / "writ"  # as installed beside this Python: pasted, it runs
    return f"""
Writ demo is running.

  MCP endpoint     {url}
  acme-payments    {backend_url}   (GET /refunds shows every refund it executed)
  state            {DEFAULT_STATE_DIR.resolve()}/

Agent token ({AGENT[0]}, role {AGENT[1]}, tenant {TENANT}):
  {agent_token}

Approver token ({APPROVER[0]}, role {APPROVER[1]}, tenant {TENANT}):
  {approver_token}
  Paste it at {url.removesuffix("/mcp")}/console to approve or reject waiting refunds, or use
  {writ} approvals list
  {writ} approvals approve ID --reason "checked" --token <approver token>

Connect a client by signing in (the browser shows Writ's sign-in page: pick a demo user, Allow):
  Claude Code      claude mcp add --transport http writ {url}
                   then /mcp, pick "writ", Authenticate

Or with a token:
  Claude Code      claude mcp add --transport http writ {url} --header "Authorization: Bearer $TOKEN"
  Claude Desktop   add to claude_desktop_config.json (stdio):
                     {{"mcpServers": {{"writ": {{
                       "command": "{Path(sys.executable).parent / "writ"}",
                       "args": ["stdio", "-c", "{DEMO_CONFIG.resolve()}"],
                       "env": {{"WRIT_TOKEN": "<agent token>"}}}}}}}}
  MCP Inspector    npx -y @modelcontextprotocol/inspector@0.21 --cli {url} --method tools/list \\
                     --header "Authorization: Bearer $TOKEN"
  (set TOKEN to the agent token above; `writ token --sub NAME --roles agent --tenant {TENANT}` mints more)

Try: lookup_order {{"order_id": "1001"}}; refund_order 20 EUR on 1001 (runs), 250 EUR on 1002 (waits
for approval), 20000 USD on 1003 (denied). Make the next refund lose its answer:
  curl -X POST {backend_url}/_chaos -H 'content-type: application/json' -d '{{"drop_responses": 1}}'
Audit the log: {writ} audit verify    Ctrl-C stops everything.
"""


class _AnnouncingServer(WritServer):
    def __init__(self, config: uvicorn.Config, resource_url: str, message: str) -> None:
        super().__init__(config, resource_url)
        self._message = message

    async def startup(self, sockets=None) -> None:  # type: ignore[no-untyped-def]
        await super().startup(sockets)
        if self.started:
            print(self._message, flush=True)


def watch_backend(process: subprocess.Popen[bytes], port: int, stopping: threading.Event) -> None:
    """Say so if acme-payments ends while the demo runs: every refund and lookup would fail as
    `backend_unreachable` from then on, and nothing else would tell the user why."""

    def wait() -> None:
        code = process.wait()
        if not stopping.is_set():
            print(
                f"writ demo: acme-payments (port {port}) exited with code {code}; every refund and lookup "
                "now fails as backend_unreachable. Stop the demo (Ctrl-C) and run `writ demo` again.",
                file=sys.stderr,
                flush=True,
            )

    threading.Thread(target=wait, name="acme-payments watch", daemon=True).start()


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def run_demo(*, port: int = 8080, backend_port: int = 8081) -> None:
    """Run until Ctrl-C or SIGTERM; either way the backend process stops with the gateway."""
    # Before ./.writ/demo.yaml is rewritten: a running demo's CLI commands and tokens read it.
    require_free_port(port, "--port", "another writ demo or writ serve")
    require_free_port(backend_port, "--backend-port", "an acme-payments left by a demo that was killed")
    config = load_config(write_demo_config(port, backend_port))
    # uvicorn shuts down on SIGTERM and then re-raises it with the handler it found: by default that
    # kills the process on the spot and the `finally` below would never stop the backend.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    backend = start_backend(backend_port)
    stopping = threading.Event()
    watch_backend(backend, backend_port, stopping)
    try:
        runtime = build_runtime(config, environ=dict(os.environ))
        issuer = runtime.dev_issuer
        assert issuer is not None
        audience = config.server.resource_url
        agent = issuer.mint(subject=AGENT[0], roles=[AGENT[1]], tenant=TENANT, audience=audience, ttl_s=86400)
        approver = issuer.mint(
            subject=APPROVER[0], roles=[APPROVER[1]], tenant=TENANT, audience=audience, ttl_s=86400
        )
        message = banner(audience, f"http://127.0.0.1:{backend_port}", agent, approver)
        server = _AnnouncingServer(
            uvicorn_config(build_app(runtime), config.server),
            audience,
            message,
        )
        server.run()
    finally:
        stopping.set()
        backend.terminate()
        try:
            backend.wait(timeout=5)
        except subprocess.TimeoutExpired:
            backend.kill()
