"""A small backend for end-to-end tests that records every request it gets (method, path, headers, body)
and answers 200 with a short JSON echo; `/unauthorized` answers 401. `GET /_seen` lists what it got.

    python -m tests.e2e.echo_backend --port 9100
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route


def build_app() -> Starlette:
    seen: list[dict[str, Any]] = []

    async def record(request: Request) -> Response:
        body = (await request.body()).decode("utf-8", "replace")
        seen.append(
            {
                "method": request.method,
                "path": request.url.path,
                "query": request.url.query,
                "headers": {k.lower(): v for k, v in request.headers.items()},
                "body": body,
            }
        )
        if request.url.path == "/unauthorized":
            return JSONResponse({"error": "invalid_token"}, status_code=401)
        return JSONResponse({"ok": True, "path": request.url.path})

    async def list_seen(request: Request) -> Response:
        return JSONResponse({"requests": seen})

    async def healthz(request: Request) -> Response:
        return JSONResponse({"ok": True})

    methods = ["GET", "POST", "PUT", "PATCH", "DELETE"]
    return Starlette(
        routes=[
            Route("/_seen", list_seen),
            Route("/healthz", healthz),
            Route("/{path:path}", record, methods=methods),
        ]
    )


def main(build: Callable[[], Starlette] = build_app) -> None:
    """Serve the app `build` makes on 127.0.0.1 at `--port` (the e2e tests' other backends too)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    uvicorn.run(build(), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
