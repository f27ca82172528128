"""Traces and metrics by the MCP and GenAI conventions, through the real app (DESIGN §9).

The gateway is built in this process by the composition root (`build_runtime`, `build_app`, uvicorn in a
thread: `tests/gateway/mcp/inproc.py`) with in-memory exporters in place of the configured ones; the
official MCP client calls it over HTTP; the demo backend, in this process too, records the trace
headers of each request it serves. On SQLite and PostgreSQL.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
import uvicorn
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server import Server
from mcp.server.transport_security import TransportSecuritySettings
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from starlette.types import ASGIApp, Receive, Scope, Send

from demo.acme_payments import create_app
from gateway.app import build_app, build_runtime
from gateway.config import load_config
from gateway.serve import uvicorn_config
from gateway.telemetry import Telemetry
from tests.e2e.harness import QUICK_LEASE_MARGIN_S, Backend, demo_config, free_port
from tests.eventually import eventually
from tests.gateway.mcp.inproc import Writ, serving

pytestmark = pytest.mark.anyio

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
META_TRACE = "0af7651916cd43dd8448eb211c80319c"
META_SPAN = "b7ad6b7169203331"
REASON = "parcel lost in transit, photos 7731"
"""An argument value no span may carry unless arguments are included."""
QUICK_WORKERS = {
    "interval_s": 0.2,
    "executor_grace_s": 0.3,
    "lease_margin_s": QUICK_LEASE_MARGIN_S,
    "reconcile_backoff_s": 0.3,
}


class TraceHeaders:
    """ASGI middleware: the trace headers of every request the backend serves, with its path."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.seen: list[tuple[str, str, str | None]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            parent = headers.get(b"traceparent")
            self.seen.append((scope["method"], scope["path"], parent.decode() if parent else None))
        await self.app(scope, receive, send)


class Recorded:
    """What one gateway exported: its spans and metrics, in memory."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()

    def telemetry(self, *, include_arguments: bool = False) -> Telemetry:
        return Telemetry(
            self.tracer_provider,
            MeterProvider(metric_readers=[self.reader]),
            include_arguments=include_arguments,
        )

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        found = list(self.exporter.get_finished_spans())
        return [s for s in found if name is None or s.name == name]

    def one(self, name: str) -> ReadableSpan:
        (span,) = self.spans(name)
        return span

    def points(self, metric: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        return [
            point
            for rm in (data.resource_metrics if data else [])
            for sm in rm.scope_metrics
            for m in sm.metrics
            if m.name == metric
            for point in m.data.data_points
        ]


@contextlib.contextmanager
def recording_backend(workdir: Path) -> Iterator[tuple[Backend, TraceHeaders]]:
    """The demo backend in this process, recording each request's `traceparent`."""
    port = free_port()
    app = TraceHeaders(create_app(workdir / "acme.db"))
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", lifespan="off", loop="asyncio"
    )
    with serving(config):
        yield Backend(f"http://127.0.0.1:{port}"), app


@contextlib.contextmanager
def traced_writ(path: Path, workdir: Path, recorded: Recorded) -> Iterator[Writ]:
    """Writ on the config at `path`, exporting into `recorded` (the config's `include_arguments` kept)."""
    config = load_config(path)
    telemetry = recorded.telemetry(include_arguments=config.telemetry.include_arguments)
    runtime = build_runtime(config, telemetry=telemetry)
    with serving(uvicorn_config(build_app(runtime), config.server)):
        yield Writ(f"http://127.0.0.1:{config.server.port}", path, workdir, runtime)


def config_at(workdir: Path, backend: Backend, store_url: str, **overrides: Any) -> Path:
    return demo_config(
        workdir, gateway_port=free_port(), backend_url=backend.url, store_url=store_url, overrides=overrides
    )


@contextlib.asynccontextmanager
async def client(
    gateway: Writ, token: str, headers: dict[str, str], mode: str = "legacy"
) -> AsyncIterator[Client]:
    """The official MCP client, sending `headers` on every HTTP request beside the bearer token."""
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}", **headers}, timeout=30) as http,
        Client(streamable_http_client(gateway.mcp_url, http_client=http), mode=mode) as connected,
    ):
        yield connected


def refund(amount: float, order_id: str = "1001") -> dict[str, Any]:
    return {"order_id": order_id, "amount": amount, "currency": "EUR", "reason": REASON}


def hexed(number: int, width: int) -> str:
    return format(number, f"0{width}x")


def traceparent_of(span: ReadableSpan) -> str:
    """The `traceparent` a request sent inside `span` carries."""
    context = span.context
    return f"00-{hexed(context.trace_id, 32)}-{hexed(context.span_id, 16)}-{hexed(context.trace_flags, 2)}"


def child_of(span: ReadableSpan, parent: ReadableSpan) -> bool:
    return span.parent is not None and span.parent.span_id == parent.context.span_id


def under(span: ReadableSpan, ancestor: ReadableSpan, spans: Sequence[ReadableSpan]) -> bool:
    """Whether `ancestor` is above `span` in its trace."""
    by_id = {s.context.span_id: s for s in spans}
    current: ReadableSpan | None = span
    while current is not None and current.parent is not None:
        if current.parent.span_id == ancestor.context.span_id:
            return True
        current = by_id.get(current.parent.span_id)
    return False


def attribute_text(spans: Sequence[ReadableSpan]) -> str:
    """Every attribute value of every span and of its events and links, as one text."""
    values: list[Any] = []
    for span in spans:
        values.append(dict(span.attributes or {}))
        values += [dict(e.attributes or {}) for e in span.events]
        values += [dict(link.attributes or {}) for link in span.links]
    return json.dumps(values, default=str)


async def test_a_call_is_one_trace_from_the_clients_traceparent_to_the_backend(
    tmp_path: Path, store_url: str
) -> None:
    recorded = Recorded()
    with recording_backend(tmp_path) as (backend, seen):
        path = config_at(tmp_path, backend, store_url)
        with traced_writ(path, tmp_path, recorded) as gateway:
            headers = {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01", "tracestate": "rojo=client-text"}
            async with client(gateway, gateway.token("alice"), headers) as mcp:
                result = await mcp.call_tool(
                    "refund_order", refund(15), meta={"writ/idempotencyKey": "t-one"}
                )
            (requested_event,) = gateway.runtime.store.events(
                tool_call_id=result.meta["writ/toolCallId"], limit=1
            )
    assert result.meta["writ/status"] == "completed"
    spans = recorded.spans()

    server = recorded.one("tools/call refund_order")
    assert server.kind == SpanKind.SERVER
    assert hexed(server.context.trace_id, 32) == CLIENT_TRACE
    assert server.parent is not None and hexed(server.parent.span_id, 16) == CLIENT_SPAN
    attributes = dict(server.attributes or {})
    assert attributes["mcp.method.name"] == "tools/call"
    assert attributes["mcp.protocol.version"] == "2025-11-25"
    assert attributes["gen_ai.operation.name"] == "execute_tool"
    assert attributes["gen_ai.tool.name"] == "refund_order"
    assert attributes["jsonrpc.request.id"]
    assert attributes["network.transport"] == "tcp" and attributes["network.protocol.name"] == "http"
    # The legacy era has a session: named by a digest, never the id that lets its holder use it.
    session = dict(recorded.one("tools/list").attributes or {})["mcp.session.id"]
    assert attributes["mcp.session.id"] == session and len(session) == 32
    assert "error.type" not in attributes

    execute = recorded.one("execute_tool refund_order")
    assert child_of(execute, server) and execute.kind == SpanKind.INTERNAL
    executed = dict(execute.attributes or {})
    assert executed["gen_ai.tool.call.id"] == result.meta["writ/toolCallId"]
    assert (executed["writ.decision"], executed["writ.status"]) == ("allow", "completed")

    # The call keeps the execute_tool span's traceparent, for later links; never the client's tracestate.
    assert requested_event.type == "tool_call.requested"
    assert requested_event.payload["trace_context"] == {"traceparent": traceparent_of(execute)}

    authorize = recorded.one("authorize refund_order")
    assert child_of(authorize, execute)
    assert dict(authorize.attributes or {})["writ.decision"] == "allow"
    writes = [s for s in recorded.spans("store write") if under(s, execute, spans)]
    assert writes and all(s.kind == SpanKind.CLIENT for s in writes)
    assert {dict(s.attributes or {})["db.operation.name"] for s in writes} == {"COMMIT"}
    dispatch = recorded.one("dispatch refund_order")
    assert child_of(dispatch, execute) and dispatch.kind == SpanKind.CLIENT

    # The backend saw the trace go on: the dispatch span is its parent.
    (sent,) = [parent for method, where, parent in seen.seen if (method, where) == ("POST", "/refunds")]
    assert sent == traceparent_of(dispatch) and sent.startswith(f"00-{CLIENT_TRACE}-")

    assert REASON not in attribute_text(spans)
    operations = {p.attributes["mcp.method.name"] for p in recorded.points("mcp.server.operation.duration")}
    assert {"initialize", "tools/list", "tools/call"} <= operations
    (tool,) = recorded.points("gen_ai.execute_tool.duration")
    assert tool.attributes == {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "refund_order"}
    assert [(p.attributes["writ.decision"], p.value) for p in recorded.points("writ.decisions")] == [
        ("allow", 1)
    ]


async def test_a_trace_context_in_meta_parents_the_server_span_over_the_http_one(tmp_path: Path) -> None:
    recorded = Recorded()
    with recording_backend(tmp_path) as (backend, _):
        path = config_at(tmp_path, backend, f"sqlite:///{tmp_path / 'writ.db'}")
        with traced_writ(path, tmp_path, recorded) as gateway:
            headers = {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"}
            async with client(gateway, gateway.token("alice"), headers, mode="2026-07-28") as mcp:
                meta = {"traceparent": f"00-{META_TRACE}-{META_SPAN}-01"}
                denied = await mcp.call_tool("refund_order", refund(20000), meta=meta)
                with pytest.raises(Exception, match="no_such_tool"):
                    await mcp.call_tool("no_such_tool", {})

    assert denied.structured_content["status"] == "denied"
    server = recorded.one("tools/call refund_order")
    assert hexed(server.context.trace_id, 32) == META_TRACE
    assert server.parent is not None and hexed(server.parent.span_id, 16) == META_SPAN
    attributes = dict(server.attributes or {})
    assert attributes["mcp.protocol.version"] == "2026-07-28"
    assert "mcp.session.id" not in attributes  # 2026-07-28 has no sessions
    decided = dict(recorded.one("execute_tool refund_order").attributes or {})
    assert (decided["writ.decision"], decided["writ.reason"]) == ("deny", "amount_over_limit")
    assert not recorded.spans("dispatch refund_order")

    unknown = dict(recorded.one("tools/call no_such_tool").attributes or {})
    assert unknown["error.type"] == unknown["rpc.response.status_code"] == "-32602"
    refused = [p for p in recorded.points("mcp.server.operation.duration") if p.attributes.get("error.type")]
    assert [(p.attributes["gen_ai.tool.name"], p.attributes["error.type"]) for p in refused] == [
        ("no_such_tool", "-32602")
    ]
    decisions = {
        (p.attributes["writ.decision"], p.attributes.get("writ.reason")): p.value
        for p in recorded.points("writ.decisions")
    }
    assert decisions == {("deny", "amount_over_limit"): 1}


async def test_an_approved_call_runs_after_a_restart_in_a_trace_linked_to_its_request(
    tmp_path: Path, store_url: str
) -> None:
    first, second = Recorded(), Recorded()
    with recording_backend(tmp_path) as (backend, seen):
        path = config_at(tmp_path, backend, store_url)
        with traced_writ(path, tmp_path, first) as gateway:
            async with client(gateway, gateway.token("alice"), {}) as mcp:
                pending = await mcp.call_tool(
                    "refund_order", refund(250, "1002"), meta={"writ/idempotencyKey": "t-ap"}
                )
            assert pending.structured_content["status"] == "approval_pending"
            (waiting,) = first.points("writ.approvals.waiting")
            assert waiting.value == 1
            approver = gateway.token("carol", roles="approver")
        requested = first.one("execute_tool refund_order")
        assert not first.spans("dispatch refund_order")

        # Approved while no gateway runs; the next one dispatches it.
        gateway.cli("approvals", "approve", pending.structured_content["approvalId"], "--token", approver)
        with traced_writ(path, tmp_path, second) as again:
            resumed = await eventually(lambda: second.spans("resume refund_order"))
            (done,) = [c for c in again.recorded_calls() if c.tool_call_id == pending.meta["writ/toolCallId"]]
            assert done.status == "completed", (done.error, done.reason)
            (waiting,) = second.points("writ.approvals.waiting")
            assert waiting.value == 0

    (resume,) = resumed
    assert resume.parent is None  # a trace of its own ...
    (link,) = resume.links  # ... linked to the one the call was requested in
    assert (link.context.trace_id, link.context.span_id) == (
        requested.context.trace_id,
        requested.context.span_id,
    )
    assert dict(resume.attributes or {})["writ.status"] == "completed"
    dispatch = second.one("dispatch refund_order")
    assert child_of(dispatch, resume)
    (sent,) = [parent for method, where, parent in seen.seen if (method, where) == ("POST", "/refunds")]
    assert sent == traceparent_of(dispatch) and dispatch.context.trace_id == resume.context.trace_id
    assert REASON not in attribute_text(first.spans() + second.spans())


async def test_a_reconciliation_is_a_trace_linked_to_the_request_and_its_outcome_is_counted(
    tmp_path: Path, store_url: str
) -> None:
    recorded = Recorded()
    with recording_backend(tmp_path) as (backend, seen):
        path = demo_config(
            tmp_path,
            gateway_port=free_port(),
            backend_url=backend.url,
            store_url=store_url,
            timeout_s=0.5,
            overrides={"workers": QUICK_WORKERS},
        )
        with traced_writ(path, tmp_path, recorded) as gateway:
            backend.chaos(drop_responses=1)
            async with client(gateway, gateway.token("alice"), {}) as mcp:
                lost = await mcp.call_tool(
                    "refund_order", refund(15, "1002"), meta={"writ/idempotencyKey": "t-rec"}
                )
            assert lost.structured_content["status"] == "result_unknown", lost.structured_content
            settled = await eventually(
                lambda: [s for s in recorded.spans("reconcile refund_order") if s.attributes]
            )

    requested = recorded.one("execute_tool refund_order")
    assert dict(requested.attributes or {})["error.type"] == "result_unknown"
    (reconcile,) = settled
    assert reconcile.parent is None
    (link,) = reconcile.links
    assert (link.context.trace_id, link.context.span_id) == (
        requested.context.trace_id,
        requested.context.span_id,
    )
    assert dict(reconcile.attributes or {})["writ.reconciliation.outcome"] == "confirmed_success"
    lookup = recorded.one("lookup refund_order")
    assert child_of(lookup, reconcile) and lookup.kind == SpanKind.CLIENT
    (asked,) = [parent for method, where, parent in seen.seen if (method, where) == ("GET", "/refunds")]
    assert asked == traceparent_of(lookup) and lookup.context.trace_id == reconcile.context.trace_id
    outcomes = {
        p.attributes["writ.reconciliation.outcome"]: p.value for p in recorded.points("writ.reconciliations")
    }
    assert outcomes == {"confirmed_success": 1}


async def test_calls_of_unknown_outcome_are_measured_while_they_wait(tmp_path: Path) -> None:
    recorded = Recorded()
    with recording_backend(tmp_path) as (backend, _):
        path = demo_config(
            tmp_path,
            gateway_port=free_port(),
            backend_url=backend.url,
            store_url=f"sqlite:///{tmp_path / 'writ.db'}",
            timeout_s=0.5,
            overrides={"workers": {"enabled": False}},  # nobody reconciles: the call stays unknown
        )
        with traced_writ(path, tmp_path, recorded) as gateway:
            (before,) = recorded.points("writ.calls.result_unknown")
            backend.chaos(drop_responses=1)
            async with client(gateway, gateway.token("alice"), {}) as mcp:
                lost = await mcp.call_tool("refund_order", refund(15, "1002"))
            (after,) = recorded.points("writ.calls.result_unknown")

    assert lost.structured_content["status"] == "result_unknown", lost.structured_content
    assert (before.value, after.value) == (0, 1)
    failed = [p.attributes for p in recorded.points("gen_ai.execute_tool.duration")]
    assert failed == [
        {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "refund_order",
            "error.type": "result_unknown",
        }
    ]


async def test_argument_values_are_in_spans_only_when_configured_and_redacted_as_stored(
    tmp_path: Path,
) -> None:
    recorded = Recorded()
    with recording_backend(tmp_path) as (backend, _):
        path = config_at(
            tmp_path, backend, f"sqlite:///{tmp_path / 'writ.db'}", telemetry={"include_arguments": True}
        )
        with traced_writ(path, tmp_path, recorded) as gateway:
            async with client(gateway, gateway.token("alice"), {}) as mcp:
                await mcp.call_tool("refund_order", refund(15, "1004"))

    shown = dict(recorded.one("execute_tool refund_order").attributes or {})["gen_ai.tool.call.arguments"]
    assert json.loads(shown) == refund(15, "1004")
    # Only on the execute_tool span: the SDK's, the store's and the backend call's carry none.
    others = [s for s in recorded.spans() if s.name != "execute_tool refund_order"]
    assert REASON not in attribute_text(others)


def echo_upstream(seen: list[str | None]) -> ASGIApp:
    """An upstream MCP server with one tool, `whoami`, recording the `traceparent` in each call's `_meta`."""
    whoami = types.Tool(name="whoami", input_schema={"type": "object"})

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[whoami])

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        seen.append((params.meta or {}).get("traceparent"))
        return types.CallToolResult(content=[types.TextContent(type="text", text="upstream")])

    server: Server[Any] = Server("echo", on_list_tools=list_tools, on_call_tool=call_tool)
    return server.streamable_http_app(
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False)
    )


async def test_an_upstream_mcp_server_gets_the_trace_in_meta(tmp_path: Path) -> None:
    recorded, seen = Recorded(), []
    port = free_port()
    upstream = uvicorn.Config(echo_upstream(seen), host="127.0.0.1", port=port, log_level="warning")
    with serving(upstream), recording_backend(tmp_path) as (backend, _):
        path = demo_config(
            tmp_path,
            gateway_port=free_port(),
            backend_url=backend.url,
            store_url=f"sqlite:///{tmp_path / 'writ.db'}",
            extra_backends={"echo": {"type": "mcp", "url": f"http://127.0.0.1:{port}/mcp", "timeout_s": 10}},
            extra_rules=[
                {"id": "agents-ask-echo", "tools": ["whoami"], "roles": ["agent"], "decision": "allow"}
            ],
        )
        with traced_writ(path, tmp_path, recorded) as gateway:
            headers = {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"}
            async with client(gateway, gateway.token("alice"), headers) as mcp:
                answered = await mcp.call_tool("whoami", {})

    assert answered.meta["writ/status"] == "completed"
    dispatch = recorded.one("dispatch whoami")
    # The SDK's client span of the upstream call, exported with Writ's, inside the dispatch ...
    sent = recorded.one("MCP send tools/call whoami")
    assert sent.kind == SpanKind.CLIENT and child_of(sent, dispatch)
    # ... is the parent the upstream sees in `_meta`, in the client's trace.
    assert seen == [traceparent_of(sent)] and seen[0].startswith(f"00-{CLIENT_TRACE}-")
