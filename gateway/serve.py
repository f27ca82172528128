"""`writ serve`: the gateway under uvicorn."""

from __future__ import annotations

import uvicorn

from gateway.app import build_app, build_runtime
from gateway.config import WritConfig


def serve_http(config: WritConfig) -> None:
    runtime = build_runtime(config)
    uvicorn.run(
        build_app(runtime),
        host=config.server.host,
        port=config.server.port,
        log_level="warning",
        access_log=False,
    )
