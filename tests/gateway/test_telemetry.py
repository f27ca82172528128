"""Each tools/call is an `execute_tool` span with GenAI attributes and Writ's decision and status."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import uvicorn
from mcp import Client
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from capabilities.fake import FakeExecutor, completed, fake_capability
from capabilities.registry import Registry
from gateway.auth.dev_issuer import DevIssuer
from gateway.auth.issuers import StaticKeys, TrustedIssuer
from gateway.auth.tokens import JwtVerifier
from gateway.calls.actions import Redactor
from gateway.calls.catalogue import Catalogue
from gateway.calls.pipeline import CallPipeline
from gateway.calls.rate_limits import RateLimiter, RateLimitsConfig
from gateway.clock import system_clock
from gateway.config import TelemetryConfig
from gateway.http.bearer import TokenRefused, bearer_backend
from gateway.mcp.server import build_mcp_server
from gateway.telemetry import Telemetry, build_telemetry
from policy.engine import Policy
from policy.model import Principal
from store.store import Store
from tests.e2e.harness import free_port
from tests.gateway.mcp.faces import face
from tests.gateway.mcp.inproc import serving

pytestmark = pytest.mark.anyio

ALICE = Principal("alice", tenant="acme", roles=frozenset({"agent"}))


async def test_a_call_becomes_an_execute_tool_span_without_argument_values(tmp_path: Path) -> None:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    telemetry = Telemetry(tracer_provider, MeterProvider(metric_readers=[reader]))

    store = Store.open(f"sqlite:///{tmp_path / 'writ.db'}")
    store.migrate()
    registry = Registry(
        {"fake": FakeExecutor(default=completed({"ok": True}))}, [fake_capability("refund_order")]
    )
    policy = Policy.from_mapping({"rules": [{"id": "all", "roles": ["agent"], "decision": "allow"}]})
    server = face(store, registry, policy, ALICE, telemetry=telemetry)
    try:
        async with Client(server) as client:
            result = await client.call_tool("refund_order", {"card": "4111111111111111"})
    finally:
        store.close()

    (span,) = [s for s in spans.get_finished_spans() if s.name.startswith("execute_tool")]
    assert span.name == "execute_tool refund_order"
    attributes = dict(span.attributes)
    assert attributes["gen_ai.operation.name"] == "execute_tool"
    assert attributes["gen_ai.tool.name"] == "refund_order"
    assert attributes["gen_ai.tool.call.id"] == result.meta["writ/toolCallId"]
    assert attributes["writ.decision"] == "allow" and attributes["writ.status"] == "completed"
    assert "4111111111111111" not in str(attributes)
    metric_names = {
        m.name
        for rm in reader.get_metrics_data().resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    assert {"writ.tool_calls", "writ.decisions", "gen_ai.execute_tool.duration"} <= metric_names


def test_telemetry_is_off_by_default_and_console_is_one_setting_away() -> None:
    assert TelemetryConfig().exporter == "none"
    build_telemetry(TelemetryConfig()).shutdown()
    console = build_telemetry(TelemetryConfig(exporter="console"))
    console.shutdown()


async def test_included_arguments_show_redacted_fields_as_their_hashes_as_the_log_does(
    tmp_path: Path,
) -> None:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    telemetry = Telemetry(tracer_provider, MeterProvider(), include_arguments=True)
    store = Store.open(f"sqlite:///{tmp_path / 'writ.db'}")
    store.migrate()
    capability = fake_capability("refund_order", redact=("card",))
    registry = Registry({"fake": FakeExecutor(default=completed({"ok": True}))}, [capability])
    policy = Policy.from_mapping({"rules": [{"id": "all", "roles": ["agent"], "decision": "allow"}]})
    redactor = Redactor(b"s")
    server = face(store, registry, policy, ALICE, redactor=redactor, telemetry=telemetry)
    try:
        async with Client(server) as client:
            await client.call_tool("refund_order", {"card": "4111111111111111", "amount": 5})
            with pytest.raises(Exception, match="nope"):
                await client.call_tool("nope", {"card": "4111111111111111"})
    finally:
        store.close()

    refund, unknown = [
        dict(s.attributes)["gen_ai.tool.call.arguments"]
        for s in spans.get_finished_spans()
        if s.name.startswith("execute_tool")
    ]
    assert refund == f'{{"amount":5,"card":"{redactor.digest("4111111111111111")}"}}'
    assert unknown == '{"card":"4111111111111111"}'  # no capability, so nothing to redact


def test_arguments_that_are_not_json_do_not_break_the_span_that_includes_arguments() -> None:
    # With include_arguments, canonical JSON of NaN (or a lone surrogate) raised before the pipeline
    # could refuse and record the call.
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    telemetry = Telemetry(tracer_provider, MeterProvider(), include_arguments=True)
    for arguments in ({"amount": float("nan")}, {"reason": "\ud800"}, {"order_id": "1001"}):
        with telemetry.tool_call("refund_order", arguments) as span:
            span.unknown_tool()
    shown = [dict(s.attributes)["gen_ai.tool.call.arguments"] for s in spans.get_finished_spans()]
    assert shown == ["<not JSON>", "<not JSON>", '{"order_id":"1001"}']


async def test_a_rate_limited_call_is_counted_in_the_tool_calls_metric(tmp_path: Path) -> None:
    reader = InMemoryMetricReader()
    telemetry = Telemetry(None, MeterProvider(metric_readers=[reader]))
    store = Store.open(f"sqlite:///{tmp_path / 'writ.db'}")
    store.migrate()
    registry = Registry(
        {"fake": FakeExecutor(default=completed({"ok": True}))}, [fake_capability("refund_order")]
    )
    policy = Policy.from_mapping({"rules": [{"id": "all", "roles": ["agent"], "decision": "allow"}]})
    limiter = RateLimiter(RateLimitsConfig(per_s=0.01, burst=1), store.take_tokens)
    server = face(store, registry, policy, ALICE, rate_limiter=limiter, telemetry=telemetry)
    try:
        async with Client(server) as client:
            await client.call_tool("refund_order", {"n": 1})
            limited = await client.call_tool("refund_order", {"n": 2})
    finally:
        store.close()

    assert limited.structured_content["reason"] == "rate_limited"
    assert tool_calls(reader) == {("completed", None): 1, ("rate_limited", "rate_limited"): 1}


async def test_a_refused_call_is_counted_with_its_reason(tmp_path: Path) -> None:
    # Budget, loop and policy refusals are told apart in the calls metric by their reason.
    reader = InMemoryMetricReader()
    telemetry = Telemetry(None, MeterProvider(metric_readers=[reader]))
    store = Store.open(f"sqlite:///{tmp_path / 'writ.db'}")
    store.migrate()
    registry = Registry(
        {"fake": FakeExecutor(default=completed({"ok": True}))}, [fake_capability("refund_order")]
    )
    frozen = {"id": "frozen", "tools": ["refund_order"], "decision": "deny", "reason": "refunds_frozen"}
    policy = Policy.from_mapping({"rules": [frozen]})
    server = face(store, registry, policy, ALICE, telemetry=telemetry)
    try:
        async with Client(server) as client:
            denied = await client.call_tool("refund_order", {"n": 1})
    finally:
        store.close()

    assert denied.structured_content["reason"] == "refunds_frozen"
    assert tool_calls(reader) == {("denied", "refunds_frozen"): 1}


def tool_calls(reader: InMemoryMetricReader) -> dict[tuple[str, str | None], int]:
    """`writ.tool_calls` by status and reason."""
    return {
        (point.attributes["writ.status"], point.attributes.get("writ.reason")): point.value
        for rm in reader.get_metrics_data().resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == "writ.tool_calls"
        for point in m.data.data_points
    }


async def test_refused_bearer_tokens_are_counted_by_kind_of_failure(tmp_path: Path) -> None:
    reader = InMemoryMetricReader()
    telemetry = Telemetry(meter_provider=MeterProvider(metric_readers=[reader]))
    issuer = DevIssuer.load_or_create(tmp_path / "key.jwk", "https://issuer.example")
    audience = "https://writ.example/mcp"
    verifier = JwtVerifier(
        [TrustedIssuer(issuer.issuer, StaticKeys(issuer.public_keys))],
        audience=audience,
        algorithms=["ES256"],
    )
    backend = bearer_backend(verifier, telemetry).token_verifier
    tokens = {
        "expired": issuer.mint(subject="a", audience=audience, now=time.time() - 7200, ttl_s=60),
        "wrong_audience": issuer.mint(subject="a", audience="https://other.example/mcp"),
        "malformed": "garbage.garbage.garbage",
    }
    for kind, token in tokens.items():
        with pytest.raises(TokenRefused) as refused:
            await backend.verify_token(token)
        assert (
            str(refused.value)
            == {
                "expired": "the token has expired",
                "wrong_audience": "the token is for another resource (aud)",
                "malformed": "the token is malformed",
            }[kind]
        )
    assert await backend.verify_token(issuer.mint(subject="a", audience=audience)) is not None

    counted = {
        point.attributes["error.type"]: point.value
        for resource in reader.get_metrics_data().resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == "writ.auth.failures"
        for point in metric.data.data_points
    }
    assert counted == {"expired": 1, "wrong_audience": 1, "malformed": 1}


async def test_spans_of_two_gateways_in_one_process_reach_each_its_own_exporter_over_stdio_framing(
    tmp_path: Path,
) -> None:
    # No HTTP here: the MCP face itself makes its telemetry the active one, so the SDK's server span
    # (made through the global tracer) lands beside Writ's, and `network.transport` is the one given.
    exporters = [InMemorySpanExporter(), InMemorySpanExporter()]
    results = []
    policy = Policy.from_mapping({"rules": [{"id": "all", "roles": ["agent"], "decision": "allow"}]})
    for n, exporter in enumerate(exporters):
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
        store = Store.open(f"sqlite:///{tmp_path / f'writ-{n}.db'}")
        store.migrate()
        registry = Registry(
            {"fake": FakeExecutor(default=completed({"ok": True}))}, [fake_capability("refund_order")]
        )
        calls = CallPipeline(store=store, registry=registry, policy=lambda: policy, redactor=Redactor(b"s"))
        server = build_mcp_server(
            calls,
            Catalogue(registry, lambda: policy),
            store,
            lambda: ALICE,
            clock=system_clock,
            telemetry=Telemetry(tracer_provider),
            transport="pipe",
        )
        try:
            async with Client(server, mode="legacy") as client:
                results.append(await client.call_tool("refund_order", {"n": n}))
        finally:
            store.close()

    for exporter, result in zip(exporters, results, strict=True):
        spans = {s.name: s for s in exporter.get_finished_spans()}
        server_span, execute = spans["tools/call refund_order"], spans["execute_tool refund_order"]
        assert dict(server_span.attributes or {})["network.transport"] == "pipe"
        assert execute.parent is not None and execute.parent.span_id == server_span.context.span_id
        assert dict(execute.attributes or {})["gen_ai.tool.call.id"] == result.meta["writ/toolCallId"]
        assert len([s for s in exporter.get_finished_spans() if s.name.startswith("execute_tool")]) == 1


def test_otlp_exports_spans_and_metrics_to_the_paths_a_collector_serves() -> None:
    # The endpoint is the collector's OTLP/HTTP base (deploy/telemetry/otel-collector.yaml listens on
    # :4318): spans go to /v1/traces and metrics to /v1/metrics, as protobuf, on shutdown at the latest.
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    received: list[tuple[str, str, bytes]] = []

    async def collect(request: Request) -> Response:
        received.append((request.url.path, request.headers["content-type"], await request.body()))
        return Response(b"", media_type="application/x-protobuf")

    app = Starlette(
        routes=[
            Route("/v1/traces", collect, methods=["POST"]),
            Route("/v1/metrics", collect, methods=["POST"]),
        ]
    )
    port = free_port()
    with serving(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")):
        telemetry = build_telemetry(TelemetryConfig(exporter="otlp", endpoint=f"http://127.0.0.1:{port}/"))
        with telemetry.tool_call("refund_order", {"card": "4111111111111111"}) as call:
            call.unknown_tool()
        telemetry.shutdown()

    assert {(path, kind) for path, kind, _ in received} == {
        ("/v1/traces", "application/x-protobuf"),
        ("/v1/metrics", "application/x-protobuf"),
    }
    spans = ExportTraceServiceRequest()
    spans.ParseFromString(b"".join(body for path, _, body in received if path == "/v1/traces"))
    names = [s.name for rs in spans.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert names == ["execute_tool refund_order"]
    resource = {a.key: a.value.string_value for a in spans.resource_spans[0].resource.attributes}
    assert resource["service.name"] == "writ"
    metrics = ExportMetricsServiceRequest()
    metrics.ParseFromString(next(body for path, _, body in received if path == "/v1/metrics"))
    exported = {m.name for rm in metrics.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert {"gen_ai.execute_tool.duration", "writ.tool_calls"} <= exported
    assert b"4111111111111111" not in b"".join(body for _, _, body in received)


def test_a_transaction_on_a_dropped_connection_keeps_its_own_error_and_its_span_ends() -> None:
    import sqlalchemy as sa

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry = Telemetry(provider, None)
    engine = sa.create_engine("sqlite://")
    telemetry.trace_transactions(engine)

    class Dropped(Exception):
        pass

    # Not SQLAlchemy's PendingRollbackError from reading the dropped connection's `info`.
    with engine.connect() as conn, pytest.raises(Dropped), conn.begin():
        conn.execute(sa.text("SELECT 1"))
        conn.invalidate()  # as when the database closes the connection mid-transaction
        raise Dropped
    [span] = exporter.get_finished_spans()
    assert span.name == "store write"
    assert span.attributes is not None and span.attributes["db.operation.name"] == "ROLLBACK"
