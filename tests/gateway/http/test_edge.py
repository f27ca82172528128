"""The one edge layer answers, notes and passes on exactly what the stack of middlewares it replaced did.

Each case is run through `Edge` and through the old stack (TraceContext, StartupErrors, EdgeRefusals,
BodyDeadline, BodyLimit, TrimHeaderValues, Starlette's AuthenticationMiddleware with Writ's bearer
backend, the SDK's AuthContextMiddleware) around the same application, with a real ES256 token; the
messages sent, what the application saw and the refusals noted must be equal, and what they are is
asserted too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.server.auth.middleware.auth_context import AuthContextMiddleware, get_access_token
from opentelemetry import trace
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.types import ASGIApp

from gateway.audit.security import SecurityRefusal
from gateway.auth.dev_issuer import DevIssuer
from gateway.auth.issuers import StaticKeys, TrustedIssuer
from gateway.auth.tokens import JwtVerifier
from gateway.http.bearer import bearer_backend, refused_token
from gateway.http.bodies import BodyLimit
from gateway.http.body_deadline import BodyDeadline
from gateway.http.edge import Edge
from gateway.http.headers import TrimHeaderValues
from gateway.http.refusals import EdgeRefusals
from gateway.http.tracing import TraceContext
from gateway.startup_errors import StartupErrors, known_cause
from gateway.telemetry import Telemetry
from store.model import StoreError

pytestmark = pytest.mark.anyio

AUDIENCE = "https://writ.example/mcp"
METADATA = "https://writ.example/.well-known/oauth-protected-resource/mcp"
DEADLINE_S = 0.2
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
Message = dict[str, Any]


class Noted:
    def __init__(self) -> None:
        self.refusals: list[SecurityRefusal] = []

    def note(self, refusal: SecurityRefusal) -> None:
        self.refusals.append(refusal)


class App:
    """Reads the body, then answers 200 with what it saw: headers, user, access token, trace."""

    def __init__(self) -> None:
        self.saw: list[Any] = []

    async def __call__(self, scope: Message, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await receive()
            try:
                raise StoreError("the database is not migrated")
            except StoreError:
                await send({"type": "lifespan.startup.failed", "message": "Traceback ...\nStoreError"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        token = get_access_token()
        span = trace.get_current_span().get_span_context()
        self.saw.append(
            {
                "headers": scope["headers"],
                "user": scope["user"].display_name if scope["user"].is_authenticated else None,
                "scopes": list(scope["auth"].scopes),
                "token_subject": (token.claims or {}).get("sub") if token is not None else None,
                "trace_id": format(span.trace_id, "032x") if span.is_valid else None,
                "body_bytes": len(body),
            }
        )
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b'{"ok": true}'})


class Client:
    """Sends the given body chunks, `gap_s` apart, then disconnects; records what it is sent."""

    def __init__(self, chunks: list[bytes], gap_s: float = 0.0) -> None:
        self.chunks, self.gap_s = list(chunks), gap_s
        self.sent: list[Message] = []

    async def receive(self) -> Message:
        if not self.chunks:
            return {"type": "http.disconnect"}
        await anyio.sleep(self.gap_s)
        body = self.chunks.pop(0)
        return {"type": "http.request", "body": body, "more_body": bool(self.chunks)}

    async def send(self, message: Message) -> None:
        self.sent.append(message)


@pytest.fixture
def verifier(tmp_path: Path) -> tuple[JwtVerifier, DevIssuer]:
    issuer = DevIssuer.load_or_create(tmp_path / "key.jwk", "https://issuer.example")
    trusted = TrustedIssuer(issuer.issuer, StaticKeys(issuer.public_keys))
    return JwtVerifier([trusted], audience=AUDIENCE, algorithms=["ES256"]), issuer


def _stacks(verifier: JwtVerifier) -> list[tuple[ASGIApp, App, Noted]]:
    """The old stack and the edge layer, each around an application and a sink of its own."""
    telemetry = Telemetry()
    built: list[tuple[ASGIApp, App, Noted]] = []
    for edge in (False, True):
        app, noted = App(), Noted()
        backend = bearer_backend(verifier, telemetry, noted)
        on_error = refused_token(METADATA)
        outer: ASGIApp
        if edge:
            outer = Edge(
                app,
                telemetry=telemetry,
                security=noted,
                backend=backend,
                on_error=on_error,
                body_timeout_s=DEADLINE_S,
                known_cause=known_cause,
                body_limit=1000,
            )
        else:
            inner = AuthenticationMiddleware(AuthContextMiddleware(app), backend=backend, on_error=on_error)
            bounded = BodyLimit(TrimHeaderValues(inner), limit=1000)
            refusing = EdgeRefusals(BodyDeadline(bounded, DEADLINE_S), security=noted)
            outer = TraceContext(StartupErrors(refusing), telemetry=telemetry)
        built.append((outer, app, noted))
    return built


async def _both(
    verifier: JwtVerifier,
    path: str,
    headers: list[tuple[bytes, bytes]],
    chunks: list[bytes],
    gap_s: float = 0.0,
) -> tuple[list[Message], list[Any], list[SecurityRefusal]]:
    """Runs the request through both stacks, checks they agree, and returns what the edge did."""
    seen = []
    for outer, app, noted in _stacks(verifier):
        client = Client(chunks, gap_s)
        scope = {
            "type": "http",
            "method": "POST",
            "path": path,
            "headers": headers,
            "client": ("10.0.0.7", 1),
        }
        await outer(scope, client.receive, client.send)
        seen.append((client.sent, app.saw, noted.refusals))
    assert seen[0] == seen[1]
    return seen[1]


def _answer(sent: list[Message]) -> tuple[int, Any]:
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, json.loads(b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"))


async def test_an_authenticated_request_reaches_the_application_with_its_token_and_trimmed_headers(
    verifier: tuple[JwtVerifier, DevIssuer],
) -> None:
    jwt, issuer = verifier
    token = issuer.mint(subject="agent-7", audience=AUDIENCE, scopes=["refunds"])
    headers = [
        (b"authorization", f"Bearer {token}".encode()),
        (b"mcp-name", b"refund_order \t"),
        (b"traceparent", f"00-{TRACE_ID}-00f067aa0ba902b7-01".encode()),
    ]
    sent, saw, refusals = await _both(jwt, "/mcp", headers, [b'{"a": 1}'])
    assert _answer(sent) == (200, {"ok": True})
    assert saw[0]["token_subject"] == "agent-7" and saw[0]["user"] is not None
    assert saw[0]["scopes"] == ["refunds"]
    assert (b"mcp-name", b"refund_order") in saw[0]["headers"]
    assert saw[0]["trace_id"] == TRACE_ID
    assert refusals == []


async def test_a_request_without_a_token_reaches_the_application_unauthenticated(
    verifier: tuple[JwtVerifier, DevIssuer],
) -> None:
    sent, saw, _ = await _both(verifier[0], "/healthz", [], [b""])
    assert _answer(sent) == (200, {"ok": True})
    assert saw[0]["user"] is None and saw[0]["token_subject"] is None and saw[0]["trace_id"] is None


async def test_a_refused_token_is_answered_401_with_its_reason_and_noted(
    verifier: tuple[JwtVerifier, DevIssuer],
) -> None:
    jwt, issuer = verifier
    token = issuer.mint(subject="agent-7", audience="https://other.example/mcp")
    sent, saw, refusals = await _both(jwt, "/mcp", [(b"authorization", f"Bearer {token}".encode())], [b"{}"])
    status, answer = _answer(sent)
    assert status == 401 and answer["error"] == "invalid_token" and "aud" in answer["error_description"]
    assert saw == []
    assert [(r.type, r.source) for r in refusals] == [("security.auth_failed", "10.0.0.7")]


async def test_a_body_over_the_limit_is_refused_413_declared_or_chunked_but_not_on_mcp(
    verifier: tuple[JwtVerifier, DevIssuer],
) -> None:
    jwt = verifier[0]
    sent, saw, refusals = await _both(jwt, "/api/x", [(b"content-length", b"5000")], [b"x" * 5000])
    assert _answer(sent)[0] == 413 and saw == []
    assert [(r.type, r.kind, r.path) for r in refusals] == [
        ("security.edge_refused", "request_too_large", "/api/x")
    ]
    sent, saw, _ = await _both(jwt, "/api/x", [], [b"x" * 600, b"x" * 600])
    assert _answer(sent)[0] == 413 and saw == []
    sent, saw, refusals = await _both(jwt, "/mcp", [], [b"x" * 600, b"x" * 600])
    assert _answer(sent)[0] == 200 and saw[0]["body_bytes"] == 1200 and refusals == []


async def test_a_body_too_slow_is_answered_408_in_the_shape_of_its_face(
    verifier: tuple[JwtVerifier, DevIssuer],
) -> None:
    jwt = verifier[0]
    sent, saw, refusals = await _both(jwt, "/api/x", [], [b"x", b"y"], gap_s=DEADLINE_S * 1.5)
    status, answer = _answer(sent)
    assert status == 408 and answer["error"] == "request_timeout" and saw == []
    assert [r.kind for r in refusals] == ["request_timeout"]
    sent, _, _ = await _both(jwt, "/mcp", [], [b"x", b"y"], gap_s=DEADLINE_S * 1.5)
    assert _answer(sent) == (
        408,
        {
            "jsonrpc": "2.0",
            "id": None,
            "error": {"code": -32600, "message": f"request body not received within {DEADLINE_S:g} s"},
        },
    )


async def test_a_startup_failure_of_writs_own_says_only_its_reason(
    verifier: tuple[JwtVerifier, DevIssuer],
) -> None:
    said = []
    for outer, _, _ in _stacks(verifier[0]):
        client = Client([])
        await outer({"type": "lifespan"}, _startup, client.send)
        said.append(client.sent)
    assert (
        said[0]
        == said[1]
        == [{"type": "lifespan.startup.failed", "message": "writ cannot start: the database is not migrated"}]
    )


async def _startup() -> Message:
    return {"type": "lifespan.startup"}
