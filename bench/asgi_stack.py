"""The CPU per request of the HTTP edge: the gateway's ASGI app driven in this process, no network.

    python -m bench.asgi_stack [--requests 2000] [--rounds 5] [--stack edge|middlewares|both]

The demo's config (dev issuer, SQLite in a temporary directory) is built by the composition root as
`writ serve` builds it (`build_runtime`, `build_app`, its lifespan), then each request is a direct call
`app(scope, receive, send)` on the event loop: `GET /healthz`, and an authenticated `POST /mcp`
`tools/list` of a 2026-07-28 client (a real ES256 JWT from the dev issuer). The figure is the thread
CPU time (`time.thread_time`) per request, the median of `--rounds` rounds, each after a warm-up, and
the number of Python frames one request enters (`sys.setprofile` "call" events: a function called, or a
coroutine resumed), which load does not move.

`--stack middlewares` rebuilds the app with the stack of middlewares it had before the one edge
layer (`gateway.http.edge.Edge`): TraceContext, StartupErrors, EdgeRefusals, BodyDeadline, BodyLimit,
TrimHeaderValues, Starlette's AuthenticationMiddleware with Writ's bearer backend, the SDK's
AuthContextMiddleware. `none` is the routes with no middleware of Writ's (only /healthz answers
there), so a /healthz row less that one is what a stack itself costs. The stacks are measured in one
process, a round of each in turn, so the load of a shared machine falls on all of them alike; the
load average is printed with the result.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from string import Template
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.types import ASGIApp, Message

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

REPO = Path(__file__).resolve().parents[1]
PROTOCOL = "2026-07-28"


def _config(workdir: Path) -> Path:
    text = Template((REPO / "demo" / "demo.yaml").read_text()).safe_substitute(
        gateway_port=8080, backend_port=9, state_dir=workdir
    )
    path = workdir / "writ.yaml"
    path.write_text(text)
    return path


def _legacy_middleware(runtime: Any, metadata_url: str) -> list[Middleware]:
    """The stack `build_app` had before `Edge`, for the comparison."""
    from mcp.server.auth.middleware.auth_context import AuthContextMiddleware
    from starlette.middleware.authentication import AuthenticationMiddleware

    from gateway.http.bearer import bearer_backend, refused_token
    from gateway.http.bodies import BodyLimit
    from gateway.http.body_deadline import BodyDeadline
    from gateway.http.headers import TrimHeaderValues
    from gateway.http.refusals import EdgeRefusals
    from gateway.http.tracing import TraceContext
    from gateway.startup_errors import StartupErrors

    return [
        Middleware(TraceContext, telemetry=runtime.telemetry),
        Middleware(StartupErrors),
        Middleware(EdgeRefusals, security=runtime.security),
        Middleware(BodyDeadline, timeout_s=runtime.config.server.body_timeout_s),
        Middleware(BodyLimit),
        Middleware(TrimHeaderValues),
        Middleware(
            AuthenticationMiddleware,
            backend=bearer_backend(runtime.verifier, runtime.telemetry, runtime.security),
            on_error=refused_token(metadata_url),
        ),
        Middleware(AuthContextMiddleware),
    ]


def _with_middleware(app: Starlette, middleware: list[Middleware]) -> Starlette:
    """`app`'s routes and lifespan under another middleware stack."""
    return Starlette(routes=app.routes, middleware=middleware, lifespan=app.router.lifespan_context)


async def _request(
    app: ASGIApp, method: str, path: str, headers: list[tuple[bytes, bytes]], body: bytes = b""
) -> tuple[int, bytes]:
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"127.0.0.1:8080"), *headers],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8080),
    }
    sent = False
    status = 0
    chunks: list[bytes] = []

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return status, b"".join(chunks)


_Call = Callable[[ASGIApp], Awaitable[tuple[int, bytes]]]


def _requests(token: str) -> dict[str, _Call]:
    meta = {
        "io.modelcontextprotocol/protocolVersion": PROTOCOL,
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": meta}}).encode()
    mcp_headers = [
        (b"authorization", f"Bearer {token}".encode()),
        (b"content-type", b"application/json"),
        (b"accept", b"application/json, text/event-stream"),
        (b"mcp-protocol-version", PROTOCOL.encode()),
        (b"mcp-method", b"tools/list"),
        (b"content-length", str(len(body)).encode()),
    ]
    bearer = [(b"authorization", f"Bearer {token}".encode())]
    return {
        "GET /healthz": lambda app: _request(app, "GET", "/healthz", []),
        "GET /healthz bearer": lambda app: _request(app, "GET", "/healthz", bearer),
        "POST /mcp tools/list": lambda app: _request(app, "POST", "/mcp", mcp_headers, body),
    }


def _applicable(stack: str, requests: dict[str, _Call]) -> dict[str, _Call]:
    # Without the stack nothing authenticates, so /mcp refuses every request: only /healthz is timed.
    return {label: call for label, call in requests.items() if stack != "none" or label == "GET /healthz"}


async def _round(app: ASGIApp, call: _Call, n: int) -> float:
    for _ in range(max(1, n // 10)):  # warm-up
        await call(app)
    start = time.thread_time()
    for _ in range(n):
        await call(app)
    return (time.thread_time() - start) / n * 1e6


async def _python_calls(app: ASGIApp, call: _Call) -> int:
    """How many Python frames one request enters, a coroutine's each time it resumes (a count load does
    not move; the fewest of five, since the event loop's scheduling varies it a little on /mcp)."""
    counts = []
    for _ in range(5):
        count = 0

        def profile(frame: Any, event: str, arg: Any) -> None:
            nonlocal count
            if event == "call":
                count += 1

        sys.setprofile(profile)
        try:
            await call(app)
        finally:
            sys.setprofile(None)
        counts.append(count)
    return min(counts)


async def _main(args: argparse.Namespace) -> None:
    from gateway.app import build_app, build_runtime
    from gateway.config import load_config

    with tempfile.TemporaryDirectory() as tmp:
        config = load_config(_config(Path(tmp)))
        runtime = build_runtime(config, environ={"PATH": os.environ.get("PATH", "")})
        assert runtime.dev_issuer is not None
        token = runtime.dev_issuer.mint(
            subject="bench-agent", audience=config.server.resource_url, tenant="acme", roles=["agent"]
        )
        edge = build_app(runtime)
        metadata_url = f"{config.server.base_url}/.well-known/oauth-protected-resource/mcp"
        stacks: dict[str, ASGIApp] = {}
        if args.stack in ("edge", "both"):
            stacks["edge"] = edge
        if args.stack in ("middlewares", "both"):
            stacks["middlewares"] = _with_middleware(edge, _legacy_middleware(runtime, metadata_url))
        stacks["none"] = _with_middleware(edge, [])  # the routes alone: what /healthz costs without a stack
        requests = _requests(token)
        async with edge.router.lifespan_context(edge):
            for name, app in stacks.items():  # each answers as it should before it is timed
                for label, call in _applicable(name, requests).items():
                    status, answer = await call(app)
                    if status != 200:
                        raise SystemExit(f"{name}: {label} answered {status}: {answer[:300]!r}")
            calls = {
                (name, label): await _python_calls(app, call)
                for name, app in stacks.items()
                for label, call in _applicable(name, requests).items()
            }
            results: dict[tuple[str, str], list[float]] = {}
            for _ in range(args.rounds):
                for name, app in stacks.items():
                    for label, call in _applicable(name, requests).items():
                        results.setdefault((name, label), []).append(await _round(app, call, args.requests))
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; ", end="")
    print(f"{args.requests} requests x {args.rounds} rounds")
    print(f"{'request':<22}{'stack':<13}{'CPU us/req median':>18}{'min':>8}{'max':>8}{'frames':>8}")
    for (name, label), values in sorted(results.items(), key=lambda item: item[0][1]):
        median, low, high = statistics.median(values), min(values), max(values)
        print(f"{label:<22}{name:<13}{median:>18.1f}{low:>8.1f}{high:>8.1f}{calls[name, label]:>8}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--stack", choices=["edge", "middlewares", "both"], default="both")
    args = parser.parse_args()
    anyio.run(_main, args)


if __name__ == "__main__":
    main()
