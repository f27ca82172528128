"""OpenTelemetry traces and metrics for tool calls, with the GenAI semantic conventions (DESIGN §9).

One `execute_tool {name}` span per tools/call carries `gen_ai.tool.name`, `gen_ai.tool.call.id` and
Writ's own attributes (decision, status, capability, run). Argument values never enter a span unless
`include_arguments` is set, and then as the log holds them: a capability's `redact` fields as their
salted hashes. Off by default; `console` or `otlp` by configuration.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from gateway.calls.pipeline import CallReport
from gateway.config import TelemetryConfig
from gateway.errors import ConfigurationError
from store.canonical import canonical_json


@dataclass
class CallSpan:
    """The span of one tools/call and the status it ended with."""

    span: Span
    status: str = "error"
    reason: str | None = None
    """Why it was refused (`budget_exceeded`, `amount_over_limit`...), for the calls metric."""
    arguments: object = None
    """The call's arguments as the client sent them, kept only with `include_arguments`."""

    def record(self, report: CallReport) -> None:
        call = report.reported
        self.status = call.status
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
        if call.status in ("failed", "result_unknown"):
            self.span.set_status(Status(StatusCode.ERROR, call.error or call.status))

    def rate_limited(self) -> None:
        """Refused by a rate limit before anything was recorded (counted as `writ.status=rate_limited`)."""
        self.status = self.reason = "rate_limited"
        self.span.set_attribute("writ.reason", "rate_limited")

    def unknown_tool(self) -> None:
        """No such tool: nothing was recorded, and no capability has fields to redact."""
        self.status = "unknown_tool"
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
        tracer_provider = tracer_provider or trace.NoOpTracerProvider()
        meter_provider = meter_provider or metrics.NoOpMeterProvider()
        self._tracer = tracer_provider.get_tracer("writ")
        meter = meter_provider.get_meter("writ")
        self._calls = meter.create_counter(
            "writ.tool_calls", unit="{call}", description="Tool calls by outcome"
        )
        self._duration = meter.create_histogram(
            "gen_ai.client.operation.duration", unit="s", description="Duration of execute_tool operations"
        )
        self._auth_failures = meter.create_counter(
            "writ.auth.failures",
            unit="{request}",
            description="Requests refused at the edge for their bearer token, by kind of failure",
        )
        self._include_arguments = include_arguments
        self._providers = (tracer_provider, meter_provider)
        self._meter = meter

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
                self._duration.record(time.perf_counter() - started, labels)
                counted = {"gen_ai.tool.name": tool_name, "writ.status": call_span.status}
                if call_span.reason:
                    counted["writ.reason"] = call_span.reason
                self._calls.add(1, counted)

    def authentication_failed(self, kind: str) -> None:
        """A bearer token refused (`kind`: expired, wrong_audience, bad_signature, untrusted_issuer...)."""
        self._auth_failures.add(1, {"error.type": kind})

    def checkpoint_age(self, age_s: Callable[[], float | None]) -> None:
        """Observe `writ.audit.checkpoint.age`: how long the newest events have waited unanchored."""

        def observe(options: CallbackOptions) -> Iterable[Observation]:
            age = age_s()
            return [] if age is None else [Observation(age)]

        self._meter.create_observable_gauge(
            "writ.audit.checkpoint.age",
            callbacks=[observe],
            unit="s",
            description="Seconds the newest events have waited for a signed checkpoint (0: none wait)",
        )

    def shutdown(self) -> None:
        for provider in self._providers:
            if hasattr(provider, "shutdown"):
                provider.shutdown()


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
