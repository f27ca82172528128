"""Writ and the acme backend in this process, for cases about what a client hears (protocol shaping).

The gateway is built from the demo's config by the composition root exactly as `writ serve` builds it
(`build_runtime`, `build_app`, `serve.uvicorn_config`: lifespan, workers, auth middleware and all), on
a store of the test's choosing; tokens are real ES256 JWTs from the config's dev issuer; the official
`mcp` client talks to it over real HTTP. No process is started, so a case costs a tenth of a second,
not the seconds an e2e case spends starting `writ serve` and the backend.

Each server runs under uvicorn in a thread of its own, on a free port, rather than behind httpx2's
`ASGITransport`. That transport does carry a client of either era through initialize and tools/list,
but it collects each response body before returning it, so an SSE stream (a legacy session's GET
stream, progress before a result) arrives only when it ends; and the gateway's HTTP executor reaches
the backend by URL, with no configuration point for a transport. Under uvicorn the gateway runs with
`writ serve`'s own settings, and a thread with its own event loop lets a synchronous helper
(`Backend.refunds`, a raw `httpx2.post`) ask a server while the test's loop waits, as e2e cases do.

`Writ` is an e2e `Gateway` (tests/e2e/harness.py): the same tokens, client, CLI (`writ` run in this
process) and reads of the record, so an e2e module moves in process by its fixtures (e2e/conftest.py
has module-scoped ones), not its cases.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn

from demo.acme_payments import create_app
from gateway.app import Runtime, build_app, build_runtime
from gateway.auth.dev_issuer import DevIssuer
from gateway.config import WritConfig, load_config
from gateway.serve import uvicorn_config
from store import Store
from tests.e2e.harness import Backend, Gateway, demo_config, free_port
from tests.eventually import eventually_sync
from tests.gateway.auth.oauth_process import AuthServer
from tests.gateway.auth.oauth_server import build_app as build_oauth_app

STOP_S = 10.0


@contextlib.contextmanager
def serving(config: uvicorn.Config) -> Iterator[uvicorn.Server]:
    """`config` served by uvicorn in a thread until the block ends (lifespan included)."""
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"uvicorn:{config.port}", daemon=True)
    thread.start()
    try:
        eventually_sync(lambda: server.started or not thread.is_alive())
        if not server.started:
            raise RuntimeError(f"uvicorn did not start on port {config.port} (see the log above)")
        yield server
    finally:
        server.should_exit = True
        thread.join(STOP_S)


@contextlib.contextmanager
def acme(workdir: Path) -> Iterator[Backend]:
    """acme-payments, served in this process."""
    port = free_port()
    config = uvicorn.Config(
        create_app(workdir / "acme.db"),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="off",
        timeout_graceful_shutdown=1,
        # asyncio's own loop, as `python -m demo.acme_payments` runs it: the chaos that drops a response
        # aborts the connection's asyncio transport, which uvloop's transports are not.
        loop="asyncio",
    )
    with serving(config):
        yield Backend(f"http://127.0.0.1:{port}")


@contextlib.contextmanager
def oauth(audience: str) -> Iterator[AuthServer]:
    """The test authorization server (`tests/gateway/auth/oauth_server.py`), served in this process."""
    port = free_port()
    issuer = f"http://127.0.0.1:{port}"
    config = uvicorn.Config(
        build_oauth_app(issuer, audience), host="127.0.0.1", port=port, log_level="warning"
    )
    with serving(config):
        yield AuthServer(issuer, None)


@dataclass
class Writ(Gateway):
    """The gateway, served in this process; its runtime (store, dev issuer) is at hand, and the reads of
    the record go through the runtime's store."""

    runtime: Runtime

    def issuing(self) -> tuple[WritConfig, DevIssuer | None]:
        """The runtime's config and dev issuer."""
        return self.runtime.config, self.runtime.dev_issuer

    @contextlib.contextmanager
    def store(self) -> Iterator[Store]:
        """The runtime's own store (the gateway keeps it open)."""
        yield self.runtime.store


@contextlib.contextmanager
def writ(workdir: Path, backend: Backend, store_url: str, **config: Any) -> Iterator[Writ]:
    """Writ on the demo's config (the e2e harness's `demo_config`, with its keywords) in front of
    `backend`, recording into `store_url`."""
    port = free_port()
    path = demo_config(workdir, gateway_port=port, backend_url=backend.url, store_url=store_url, **config)
    with served(path, workdir) as gateway:
        yield gateway


@contextlib.contextmanager
def served(path: Path, workdir: Path) -> Iterator[Writ]:
    """Writ on the config file at `path` (a config of the case's own, not the demo's), as `writ serve -c
    PATH` run in `workdir` would serve it."""
    writ_config = load_config(path)
    runtime = build_runtime(writ_config)
    with serving(uvicorn_config(build_app(runtime), writ_config.server)):
        yield Writ(f"http://127.0.0.1:{writ_config.server.port}", path, workdir, runtime)
