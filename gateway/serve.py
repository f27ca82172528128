"""`writ serve`: the gateway under uvicorn, with bounds on how long a client may take to send a request."""

from __future__ import annotations

import contextlib
import gc
import logging
import socket
import sys

import uvicorn
from starlette.types import ASGIApp

from gateway.app import build_app, build_runtime
from gateway.config import ServerConfig, WritConfig
from gateway.http.header_deadline import protocol_class

STARTUP_FAILURE = 3
"""The exit status `uvicorn.run` uses when the server did not start."""

logger = logging.getLogger(__name__)


class WritServer(uvicorn.Server):
    """uvicorn's server, saying Writ is ready once it listens: the app's lifespan (where the store,
    workers and upstreams start) runs before uvicorn binds the port, which may then be taken."""

    def __init__(self, config: uvicorn.Config, resource_url: str) -> None:
        super().__init__(config)
        self.resource_url = resource_url

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            # The public URL may name another port (a proxy, a second replica's `--port`): say both.
            listening = f"{self.config.host}:{self.config.port}"
            logger.info("writ ready: MCP at %s (listening on %s)", self.resource_url, listening)


def uvicorn_config(app: ASGIApp, server: ServerConfig) -> uvicorn.Config:
    """uvicorn's settings for the `server:` section (the body's deadline is in the app itself)."""
    return uvicorn.Config(
        app,
        host=server.host,
        port=server.port,
        http=protocol_class(server.http_parser, server.header_timeout_s),
        ws="none",  # Writ serves no WebSockets; without them no upgrade path can skip the deadline
        timeout_keep_alive=server.keep_alive_timeout_s,
        limit_concurrency=server.limit_concurrency,
        # uvicorn believes X-Forwarded-For from 127.0.0.1 unless told otherwise: any local client
        # could then choose the address its rate limits and security events are counted under.
        proxy_headers=bool(server.forwarded_allow_ips),
        forwarded_allow_ips=server.forwarded_allow_ips,
        log_level="warning",
        access_log=False,
    )


def serve_http(config: WritConfig) -> None:
    runtime = build_runtime(config)
    server = WritServer(uvicorn_config(build_app(runtime), config.server), config.server.resource_url)
    # What startup built (modules, config, policy, models) lives as long as the process: frozen, the
    # collector no longer walks it in every full collection, which under load cost about 0.5 ms of
    # CPU per call (bench/README.md, "Gateway CPU per read").
    gc.collect()
    gc.freeze()
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    if not server.started:  # as `uvicorn.run` does: the port was taken, or the lifespan failed
        sys.exit(STARTUP_FAILURE)
