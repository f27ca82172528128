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
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import uvicorn
from mcp import Client

from demo.acme_payments import create_app
from gateway.app import Runtime, build_app, build_runtime
from gateway.config import load_config
from gateway.serve import uvicorn_config
from store.model import CallView
from tests.e2e.harness import demo_config, free_port, mcp_client
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


@dataclass
class Backend:
    """acme-payments, served in this process."""

    url: str

    def refunds(self, key: str | None = None) -> list[dict[str, Any]]:
        params = {"idempotency_key": key} if key else None
        return httpx2.get(f"{self.url}/refunds", params=params, timeout=5).json()["refunds"]


@contextlib.contextmanager
def acme(workdir: Path) -> Iterator[Backend]:
    port = free_port()
    config = uvicorn.Config(
        create_app(workdir / "acme.db"),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="off",
        timeout_graceful_shutdown=1,
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
class Writ:
    """The gateway, served in this process; its runtime (store, dev issuer) is at hand."""

    url: str
    runtime: Runtime

    @property
    def mcp_url(self) -> str:
        return f"{self.url}/mcp"

    def token(self, sub: str, roles: str = "agent", tenant: str = "acme") -> str:
        """A token from the gateway's dev issuer, as `writ token` mints it."""
        issuer, config = self.runtime.dev_issuer, self.runtime.config
        assert issuer is not None, "the demo config turns the dev issuer on"
        return issuer.mint(
            subject=sub,
            audience=config.server.resource_url,
            tenant=tenant,
            roles=[r.strip() for r in roles.split(",") if r.strip()],
            ttl_s=config.auth.dev_issuer.token_ttl_s,
        )

    def client(self, token: str, mode: str = "auto", **kwargs: Any) -> AbstractAsyncContextManager[Client]:
        return mcp_client(self.mcp_url, token, mode=mode, **kwargs)

    def event_types(self, tool_call_id: str) -> list[str]:
        """The types of a call's events, in order (what `writ calls show` lists)."""
        return [event.type for event in self.runtime.store.events(tool_call_id=tool_call_id)]

    def recorded_calls(self) -> list[CallView]:
        """The newest calls, as `writ calls list` shows them."""
        return self.runtime.store.list_calls()


@contextlib.contextmanager
def writ(workdir: Path, backend: Backend, store_url: str, **config: Any) -> Iterator[Writ]:
    """Writ on the demo's config (the e2e harness's `demo_config`, with its keywords) in front of
    `backend`, recording into `store_url`."""
    port = free_port()
    path = demo_config(workdir, gateway_port=port, backend_url=backend.url, store_url=store_url, **config)
    writ_config = load_config(path)
    runtime = build_runtime(writ_config)
    with serving(uvicorn_config(build_app(runtime), writ_config.server)):
        yield Writ(f"http://127.0.0.1:{port}", runtime)
