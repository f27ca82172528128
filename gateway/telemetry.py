"""OpenTelemetry traces and metrics, by the MCP and GenAI semantic conventions (DESIGN §9).

Spans. Each MCP request is a SERVER span `{mcp.method.name} {target}` (the MCP SDK makes it; Writ adds
the session, transport and network attributes: `gateway.mcp.tracing`); each tools/call has an
`execute_tool {name}` span inside it with `gen_ai.tool.name`, `gen_ai.tool.call.id` and Writ's own
attributes (decision, status, capability, run); inside that, the policy decision (`authorize`), one
span per store transaction and the backend call (`dispatch`, whose context travels to the backend).
An approved call's dispatch (`resume`) and each reconciliation (`reconcile`) are traces of their own,
linked to the trace the call was requested in (kept in its `tool_call.requested` event).

Argument values never enter a span unless `include_arguments` is set, and then as the log holds them:
a capability's `redact` fields as their salted hashes. Off by default; `console` or `otlp` by
configuration.

Providers. Writ's own spans, the call domain's (which uses only the OpenTelemetry API) and the MCP SDK's
(which uses the global tracer) all reach the configured provider: Writ installs, once per process, a
global tracer provider that hands each span to the provider of the gateway whose request or worker is
running (a context variable, set by `Telemetry.activated`). So two gateways in one process (tests)
keep their spans apart, and none is lost. A process that had set its own global provider first keeps
it: the SDK's and the call domain's spans then go there.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from sqlalchemy import Engine, event

from gateway.calls.pipeline import CallReport
from gateway.config import TelemetryConfig
from gateway.errors import ConfigurationError
from store.canonical import canonical_json
from store.db import READ_ONLY
from store.model import StoreError

logger = logging.getLogger(__name__)

DURATION_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)
"""The buckets the MCP conventions give `mcp.server.operation.duration` (seconds)."""
FAILED_STATUSES = ("failed", "result_unknown")


@dataclass
class CallSpan:
    """The span of one tools/call and the status it ended with."""

    span: Span
    status: str = "error"
    reason: str | None = None
    """Why it was refused (`budget_exceeded`, `amount_over_limit`...), for the calls metric."""
    decision: str | None = None
    """The policy's effect on a call this request admitted (not on one it joined)."""
    arguments: object = None
    """The call's arguments as the client sent them, kept only with `include_arguments`."""

    def record(self, report: CallReport) -> None:
        call = report.reported
        self.status = call.status
        if report.kind == "new":
            self.decision = call.decision_effect
        if self.arguments is not None:
            # As stored: the client's copy has the clear value of every `redact` field.
            self.span.set_attribute("gen_ai.tool.call.arguments", _arguments_text(call.arguments))
        self.span.set_attributes(
            {
                "gen_ai.tool.call.id": call.tool_call_id,
                "gen_ai.tool.type": "function",
                "writ.capability": f"{call.capability_id}@{call.capability_version}",
                "writ.admission": report.kind,
                "writ.decision": call.decision_effect,
                "writ.status": call.status,
                "writ.run_id": call.run_id,
                "writ.tenant": call.tenant,
                "writ.policy_version": call.policy_version,
            }
        )
        if call.reason:
            self.span.set_attribute("writ.reason", call.reason)
            if call.status in ("denied", "rejected"):
                self.reason = call.reason
        if call.status in FAILED_STATUSES:
            # The class of the error, as the conventions ask (low cardinality); the backend's own word
            # (`http_500`, `connection_lost`) beside it.
            self.span.set_attribute("error.type", call.status)
            if call.error:
                self.span.set_attribute("writ.error", call.error)
            self.span.set_status(Status(StatusCode.ERROR, call.error or call.status))

    def rate_limited(self) -> None:
        """Refused by a rate limit before anything was recorded (counted as `writ.status=rate_limited`)."""
        self.status = self.reason = "rate_limited"
        self.span.set_attribute("writ.reason", "rate_limited")

    def unknown_tool(self) -> None:
        """No such tool: nothing was recorded, and no capability has fields to redact."""
        self.status = "unknown_tool"
        self.span.set_attribute("error.type", "unknown_tool")
        if self.arguments is not None:
            self.span.set_attribute("gen_ai.tool.call.arguments", _arguments_text(self.arguments))


class Telemetry:
    """Creates spans and records metrics for tool calls through the providers it is given."""

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        *,
        include_arguments: bool = False,
    ) -> None:
        _route_global_tracing()
        tracer_provider = tracer_provider or trace.NoOpTracerProvider()
        meter_provider = meter_provider or metrics.NoOpMeterProvider()
        self.tracer_provider = tracer_provider
        self._tracer = tracer_provider.get_tracer("writ")
        meter = meter_provider.get_meter("writ")
        self._meter = meter
        self._calls = meter.create_counter(
            "writ.tool_calls", unit="{call}", description="Tool calls by outcome"
        )
        self._decisions = meter.create_counter(
            "writ.decisions",
            unit="{call}",
            description="Policy decisions on admitted calls, by effect and reason",
        )
        self._tool_duration = meter.create_histogram(
            "gen_ai.execute_tool.duration",
            unit="s",
            description="Duration of tool executions (tools/call through Writ)",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self._operation_duration = meter.create_histogram(
            "mcp.server.operation.duration",
            unit="s",
            description="MCP request or notification duration, from receipt to the result",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self._auth_failures = meter.create_counter(
            "writ.auth.failures",
            unit="{request}",
            description="Requests refused at the edge for their bearer token, by kind of failure",
        )
        self._security_refusals = meter.create_counter(
            "writ.security.refusals",
            unit="{refusal}",
            description="Refusals recorded as security.* events (each one, before the rate bound)",
        )
        self._reconciliations = meter.create_counter(
            "writ.reconciliations",
            unit="{attempt}",
            description="Reconciliation attempts of calls in result_unknown, by outcome",
        )
        self._include_arguments = include_arguments
        self._providers = (tracer_provider, meter_provider)
        self._open = True
        """False after `shutdown`: a reader may still collect, and the store is closed by then."""

    @property
    def exports_spans(self) -> bool:
        """Whether spans go anywhere (an exporter is configured), not to a no-op provider."""
        return not isinstance(self.tracer_provider, trace.NoOpTracerProvider)

    @contextlib.contextmanager
    def activated(self) -> Iterator[None]:
        """Within this block (and the tasks and threads it starts), spans made through the global
        OpenTelemetry API, the MCP SDK's among them, go to this telemetry's tracer provider."""
        token = _ACTIVE.set(self.tracer_provider)
        try:
            yield
        finally:
            _ACTIVE.reset(token)

    @contextlib.contextmanager
    def tool_call(self, tool_name: str, arguments: object) -> Iterator[CallSpan]:
        """A span around one tools/call; the caller records what the pipeline decided on it."""
        started = time.perf_counter()
        with self._tracer.start_as_current_span(
            f"execute_tool {tool_name}",
            kind=SpanKind.INTERNAL,
            attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool_name},
        ) as span:
            call_span = CallSpan(span, arguments=arguments if self._include_arguments else None)
            try:
                yield call_span
            finally:
                labels = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool_name}
                if call_span.status in (*FAILED_STATUSES, "unknown_tool", "error"):
                    labels["error.type"] = call_span.status
                self._tool_duration.record(time.perf_counter() - started, labels)
                counted = {"gen_ai.tool.name": tool_name, "writ.status": call_span.status}
                if call_span.reason:
                    counted["writ.reason"] = call_span.reason
                self._calls.add(1, counted)
                if call_span.decision:
                    decided = {"writ.decision": call_span.decision, "gen_ai.tool.name": tool_name}
                    if call_span.reason:
                        decided["writ.reason"] = call_span.reason
                    self._decisions.add(1, decided)

    def mcp_operation(self, seconds: float, attributes: Mapping[str, str]) -> None:
        """One MCP request or notification served (`mcp.server.operation.duration`)."""
        self._operation_duration.record(seconds, dict(attributes))

    def authentication_failed(self, kind: str) -> None:
        """A bearer token refused (`kind`: expired, wrong_audience, bad_signature, untrusted_issuer...)."""
        self._auth_failures.add(1, {"error.type": kind})

    def security_refused(self, event_type: str, kind: str) -> None:
        """One refusal a `security.*` event will count (failed authentication, unknown tool, edge)."""
        self._security_refusals.add(1, {"writ.security.type": event_type, "writ.security.kind": kind})

    def checkpoint_age(self, age_s: Callable[[], float | None]) -> None:
        """Observe `writ.audit.checkpoint.age`: how long the newest events have waited unanchored."""

        def observe(options: CallbackOptions) -> Iterable[Observation]:
            if not self._open:
                return []
            age = age_s()
            return [] if age is None else [Observation(age)]

        self._meter.create_observable_gauge(
            "writ.audit.checkpoint.age",
            callbacks=[observe],
            unit="s",
            description="Seconds the newest events have waited for a signed checkpoint (0: none wait)",
        )

    def reconciled(self, outcome: str) -> None:
        """One reconciliation attempt ended (`confirmed_success`, `inconclusive`, `escalated`...)."""
        self._reconciliations.add(1, {"writ.reconciliation.outcome": outcome})

    def observe_waiting(self, counts: Callable[[], Mapping[str, int]]) -> None:
        """Gauges of the calls waiting on someone, read from `counts` (the store) at each collection:
        `writ.approvals.waiting` (for an approver) and `writ.calls.result_unknown` (for evidence)."""

        def gauge(status: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
            def observe(options: CallbackOptions) -> Iterable[Observation]:
                if not self._open:
                    return []
                try:
                    return [Observation(counts().get(status, 0))]
                except StoreError as exc:  # no reading, rather than a wrong one
                    logger.warning("%s not measured: %s", status, exc)
                    return []

            return observe

        self._meter.create_observable_gauge(
            "writ.approvals.waiting",
            [gauge("approval_pending")],
            unit="{call}",
            description="Calls waiting for an approver's decision",
        )
        self._meter.create_observable_gauge(
            "writ.calls.result_unknown",
            [gauge("result_unknown")],
            unit="{call}",
            description="Calls whose outcome is unknown, waiting for reconciliation or a person",
        )

    def trace_transactions(self, engine: Engine) -> None:
        """One span per store transaction on `engine` (`store read` or `store write`), in the trace of
        whatever opened it: the span starts before the transaction begins, so a wait for the write
        lock is in it."""
        tracer, system = self._tracer, engine.dialect.name
        # Kept beside the connection, not in `conn.info`: the rollback of a connection the database
        # dropped comes here too, and reading its `info` then raises (PendingRollbackError), which
        # would replace the store's own error ("unavailable") with a confusing one.
        spans: weakref.WeakKeyDictionary[Any, Span] = weakref.WeakKeyDictionary()

        def begin(conn: Any) -> None:
            kind = "read" if conn.get_execution_options().get(READ_ONLY) else "write"
            span = tracer.start_span(
                f"store {kind}", kind=SpanKind.CLIENT, attributes={"db.system.name": system}
            )
            spans[conn] = span

        def finish(outcome: str) -> Callable[[Any], None]:
            def end(conn: Any) -> None:
                span = spans.pop(conn, None)
                if span is not None:
                    span.set_attribute("db.operation.name", outcome)
                    if outcome == "ROLLBACK":
                        span.set_attribute("error.type", "rollback")
                    span.end()

            return end

        event.listen(engine, "begin", begin, insert=True)
        event.listen(engine, "commit", finish("COMMIT"))
        event.listen(engine, "rollback", finish("ROLLBACK"))

    def shutdown(self) -> None:
        for provider in self._providers:
            if hasattr(provider, "shutdown"):
                provider.shutdown()  # a last collection reads the gauges
        self._open = False


def session_label(session_id: str) -> str:
    """`mcp.session.id` as spans carry it: a digest, since the id itself lets its holder use the session."""
    return hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def build_telemetry(config: TelemetryConfig) -> Telemetry:
    """Providers for the configured exporter (none, console, otlp).

    Raises:
        ConfigurationError: `otlp` without the OTLP exporter package installed.
    """
    if config.exporter == "none":
        return Telemetry()
    resource = Resource.create({"service.name": config.service_name})
    span_exporter: SpanExporter
    if config.exporter == "console":
        span_exporter = ConsoleSpanExporter()
        metric_reader = PeriodicExportingMetricReader(ConsoleMetricExporter(), export_interval_millis=60_000)
    else:
        try:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError as exc:
            raise ConfigurationError(
                "telemetry.exporter: otlp needs the OTLP exporter: pip install 'writ-gateway[otlp]'"
            ) from exc
        endpoint = config.endpoint.rstrip("/") if config.endpoint else None
        span_exporter = OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces" if endpoint else None)
        metric_reader = PeriodicExportingMetricReader(
            OTLPMetricExporter(endpoint=f"{endpoint}/v1/metrics" if endpoint else None)
        )
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
    meter_provider = MeterProvider(resource=resource, metric_readers=[metric_reader])
    return Telemetry(tracer_provider, meter_provider, include_arguments=config.include_arguments)


def _arguments_text(arguments: object) -> str:
    # Arguments that are not JSON (NaN, a lone surrogate, absurd nesting) are refused by the pipeline;
    # the span says so instead of failing the call before the refusal is recorded.
    try:
        return canonical_json(arguments).encode("utf-8").decode("utf-8")
    except (ValueError, RecursionError):  # UnicodeEncodeError is a ValueError
        return "<not JSON>"


# -- the global tracer provider, routed to the active gateway's ----------------------------------------

_ACTIVE: ContextVar[trace.TracerProvider | None] = ContextVar("writ_tracer_provider", default=None)
_NO_OP = trace.NoOpTracer()


class _RoutedTracer(trace.Tracer):
    """A tracer that starts each span with the tracer provider active where the span starts."""

    def __init__(self, name: str, version: str | None, schema_url: str | None) -> None:
        self._name, self._version, self._schema_url = name, version, schema_url
        self._tracers: weakref.WeakKeyDictionary[trace.TracerProvider, trace.Tracer] = (
            weakref.WeakKeyDictionary()
        )

    def _target(self) -> trace.Tracer:
        provider = _ACTIVE.get()
        if provider is None or type(provider) is trace.NoOpTracerProvider:
            # Telemetry off (its tracer would be a no-op one too): no weak reference made to look it up.
            return _NO_OP
        found = self._tracers.get(provider)
        if found is None:
            found = self._tracers[provider] = provider.get_tracer(self._name, self._version, self._schema_url)
        return found

    def start_span(self, *args: Any, **kwargs: Any) -> Span:
        return self._target().start_span(*args, **kwargs)

    def start_as_current_span(  # type: ignore[override]  # the API's context manager type is private
        self, *args: Any, **kwargs: Any
    ) -> contextlib.AbstractContextManager[Span]:
        # The target's own context manager, not one more generator around it: several spans a call.
        return self._target().start_as_current_span(*args, **kwargs)


class _RoutingTracerProvider(trace.TracerProvider):
    def get_tracer(
        self,
        instrumenting_module_name: str,
        instrumenting_library_version: str | None = None,
        schema_url: str | None = None,
        attributes: Any = None,
    ) -> trace.Tracer:
        return _RoutedTracer(instrumenting_module_name, instrumenting_library_version, schema_url)


_routed = False


def _route_global_tracing() -> None:
    """Make the global tracer provider Writ's router, unless the process already chose one."""
    global _routed
    if _routed:
        return
    _routed = True
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        trace.set_tracer_provider(_RoutingTracerProvider())
    else:
        logger.info("a global tracer provider is already set: the MCP SDK's spans go to it")
