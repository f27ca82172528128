"""Spans of the call domain, through the OpenTelemetry API only (DESIGN §9).

The call domain names what it does (authorize, dispatch, resume, reconcile) and keeps the trace
context a call was requested in; which provider exports the spans is the composition root's choice
(`gateway.telemetry`). A call's first trace context is recorded in its `tool_call.requested` event, so
the spans of its approved dispatch and of each reconciliation, in other traces and possibly another
process, link to it after a restart too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Protocol

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import Link

from store.model import StoredEvent, StoreError

logger = logging.getLogger(__name__)
tracer = trace.get_tracer("writ")

TRACE_KEYS = ("traceparent", "tracestate")

FirstTrace = Callable[[str], Mapping[str, str] | None]
"""The trace context a call was requested in, by tool call id (None: none recorded)."""


class CallEvents(Protocol):
    def events(self, *, tool_call_id: str | None = None, limit: int | None = None) -> list[StoredEvent]: ...


def current_trace_context() -> dict[str, str] | None:
    """The W3C `traceparent` of the current span, to record with a call; None when nothing traces it."""
    if not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    # Only `traceparent` (55 characters Writ wrote): a link needs no more, and `tracestate` is the
    # client's text (up to 32 entries), which has no business in a log nothing can be removed from.
    parent = carrier.get("traceparent")
    return {"traceparent": parent} if parent else None


def links_to(trace_context: Mapping[str, str] | None) -> list[Link]:
    """A link to the span a recorded trace context names; none for a missing or malformed one."""
    if not trace_context:
        return []
    carrier = {key: value for key, value in trace_context.items() if key in TRACE_KEYS}
    try:
        linked = trace.get_current_span(propagate.extract(carrier)).get_span_context()
    except (ValueError, TypeError):
        return []
    return [Link(linked, {"writ.link": "first_request"})] if linked.is_valid else []


def first_trace_of(store: CallEvents) -> FirstTrace:
    """Reads a call's first trace context from its `tool_call.requested` event (its first event)."""

    def first_trace(tool_call_id: str) -> Mapping[str, str] | None:
        try:
            found = store.events(tool_call_id=tool_call_id, limit=1)
        except StoreError as exc:  # a link is worth less than the work it would hold up
            logger.warning("trace context of %s not read: %s", tool_call_id, exc)
            return None
        if not found or found[0].type != "tool_call.requested":
            return None
        recorded = found[0].payload.get("trace_context")
        if not isinstance(recorded, dict):
            return None
        return {k: v for k, v in recorded.items() if isinstance(k, str) and isinstance(v, str)}

    return first_trace


def no_first_trace(tool_call_id: str) -> Mapping[str, str] | None:
    """For a worker built without a log to read: its spans link nowhere."""
    return None


ROOT = Context()
"""A worker's span starts a trace of its own (linked to the call's first), never a child of another."""
