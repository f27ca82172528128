"""What a capability is, and what an executor promises.

A capability is one backend tool as Writ exposes it: an id and version, an MCP tool name, an input
schema, an effect class and the facts the runtime needs to keep effects at most once (whether the
backend deduplicates on the idempotency key, how to look an outcome up afterwards).

Executors perform effects and report what they observed as an `Outcome`. They never write the log:
the gateway's pipeline records what they report.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, Protocol, runtime_checkable

EffectClass = Literal["read", "write", "irreversible", "confirm"]
"""`read` has no side effect; `write` and `irreversible` do (`irreversible` cannot be compensated);
`confirm` has a side effect the user confirms in the client."""

CapabilityKind = Literal["tool", "resource", "prompt"]
"""What a client asks for: a tool call (`tools/call`), a resource read (`resources/read`, one capability
per backend whose URIs it serves) or a prompt get (`prompts/get`, one capability per prompt)."""

OutcomeKind = Literal["completed", "failed", "unknown"]
"""`unknown`: the backend may have acted and no answer came back. Never treated as `failed`."""

ReconcileVerdict = Literal["succeeded", "failed", "not_found", "inconclusive"]


class CapabilityError(Exception):
    """Root of the errors raised by this package."""

    retryable: bool = False


class ConfigError(CapabilityError):
    """A backend or capability definition is invalid."""


def config_problems(errors: Iterable[Mapping[str, Any]], data: object = None) -> list[str]:
    """One line per pydantic error, `where: message`, without pydantic's echo of the input and its links
    (the value may be long, or a secret, and the message is what to fix).

    `where` is the field's path in `data`, the input that was validated, without the steps pydantic
    adds of its own (a union's tag, a validator's name); a backend or a capability is named as people
    name it. Every config section (and the policy file) is described by this one function, so an
    operator reads one style of message whichever section is wrong.
    """
    return [_problem(error, data) for error in errors]


def _problem(error: Mapping[str, Any], data: object) -> str:
    path: list[str | int] = []
    node, tag_skipped = data, False
    for part in error.get("loc", ()):
        if str(part).startswith("function-"):
            continue
        if isinstance(node, Mapping) and node.get("type") == part and not tag_skipped:
            tag_skipped = True  # a discriminated union's tag (`header`), perhaps before a field so named
            continue
        path.append(part)
        if isinstance(node, Mapping):
            node = node.get(part)
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        else:
            node = None
        tag_skipped = False
    where: list[str] = []
    if len(path) > 1 and path[0] == "backends":
        where.append(f"backend {path[1]!r}")
        path = path[2:]
    elif len(path) > 1 and path[0] == "capabilities" and isinstance(path[1], int):
        entries = data.get("capabilities") if isinstance(data, Mapping) else None
        entry = entries[path[1]] if isinstance(entries, list) and path[1] < len(entries) else None
        ident = entry.get("id") if isinstance(entry, Mapping) else None
        where.append(
            f"capability {ident!r}" if isinstance(ident, str) and ident else f"capabilities[{path[1]}]"
        )
        path = path[2:]
    if path:
        where.append(".".join(str(part) for part in path))
    message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
    return f"{': '.join(where)}: {message}" if where else message


class BackendUnavailable(CapabilityError):
    """A backend could not be reached before anything was sent (safe to retry)."""

    retryable = True


@dataclass(frozen=True, slots=True)
class ToolResult:
    """A tool result in MCP's shape, as plain JSON-able data.

    `content` holds MCP content blocks as dicts (`{"type": "text", "text": ...}`).
    """

    content: tuple[Mapping[str, Any], ...] = ()
    structured: Mapping[str, Any] | None = None
    is_error: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "content": [dict(block) for block in self.content],
            "structuredContent": dict(self.structured) if self.structured is not None else None,
            "isError": self.is_error,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ToolResult:
        structured = data.get("structuredContent")
        return cls(
            content=tuple(dict(block) for block in data.get("content") or ()),
            structured=dict(structured) if structured is not None else None,
            is_error=bool(data.get("isError", False)),
        )


@dataclass(frozen=True, slots=True)
class Capability:
    """One tool as Writ exposes it; immutable, built once at startup from config (and upstream discovery)."""

    id: str
    version: str
    tool_name: str
    backend: str
    input_schema: Mapping[str, Any]
    effect: EffectClass = "write"
    description: str = ""
    title: str | None = None
    dedupes_on_key: bool = False
    """The backend itself deduplicates on the idempotency key, so re-sending the same key is safe."""
    dedupe_window_s: int = 600
    """How long an identical call without a client key joins an earlier completed one."""
    timeout_s: float = 30.0
    commit_horizon_s: float | None = None
    """Seconds after Writ records a dispatch (just before sending it) past which the backend can no
    longer commit that request; None: `timeout_s + DEFAULT_HORIZON_MARGIN_S`. A lookup that finds
    nothing proves a failure only after it."""
    redact: tuple[str, ...] = ()
    """Top-level argument names stored only as salted hashes."""
    summary: str | None = None
    """A template like "refund {amount} {currency} to order {order_id}" shown to approvers and models."""
    reconcilable: bool = False
    """The executor can look up the outcome of an earlier dispatch (by key or external request id)."""
    output_schema: Mapping[str, Any] | None = None
    """JSON Schema of the structured result, when the backend declares one (upstream MCP tools)."""
    definition: Mapping[str, Any] = field(default_factory=dict)
    """What else defines the effect, as configured: the request mapping, the backend's settings
    (secrets only by where they come from), the lookup. Part of the contract an approval binds."""
    kind: CapabilityKind = "tool"
    """A tool; or a relayed resource read or prompt get, which are never listed or called as tools."""

    @property
    def horizon_s(self) -> float:
        """The commit horizon in force: declared, or the conservative default."""
        if self.commit_horizon_s is not None:
            return self.commit_horizon_s
        return self.timeout_s + DEFAULT_HORIZON_MARGIN_S

    @property
    def ref(self) -> str:
        """`refund-order@2`: how events, results and people name this capability."""
        return f"{self.id}@{self.version}"

    def summarize(self, arguments: Mapping[str, Any]) -> str:
        """A one-line description of the concrete effect, at most `MAX_SUMMARY` characters; falls back
        to the tool name and arguments."""
        if self.summary:
            try:
                return _clipped(self.summary.format_map(_Missing(arguments)))
            except (ValueError, IndexError, KeyError, AttributeError, TypeError):
                # `{order[id]}`, `{amount:.2f}` or `{id.name}` over arguments of another shape (the
                # client chose it): the fallback, not an error before the call is even recorded.
                pass
        shown = ", ".join(f"{k}={'***' if k in self.redact else v!r}" for k, v in sorted(arguments.items()))
        return _clipped(f"{self.tool_name}({shown})")


DEFAULT_HORIZON_MARGIN_S = 600.0
"""Without a declared horizon, a request is presumed able to land up to ten minutes past its timeout:
queues, lock waits and paused processes hold requests far longer than a client waits for them."""

NAME_CHARS = 256
"""The longest capability id and tool name (a relayed read's URI) Writ records: the store's columns
hold this many (tests/store/test_scoping.py checks), and PostgreSQL refuses a longer value."""

MAX_SUMMARY = 300
"""The summary is a line: it is stored with the call, shown to approvers and told to the model. Built
from arguments as they came, it was as long as they were (a 4 MB argument, a 4 MB summary)."""


def _clipped(summary: str) -> str:
    if len(summary) <= MAX_SUMMARY:
        return summary
    tail = f"... ({len(summary)} characters in all)"
    return summary[: MAX_SUMMARY - len(tail)] + tail


class _Missing(dict):  # type: ignore[type-arg]
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


@dataclass(frozen=True, slots=True)
class Invocation:
    """One concrete dispatch, as the pipeline hands it to an executor."""

    capability: Capability
    arguments: Mapping[str, Any]
    idempotency_key: str
    tool_call_id: str
    external_request_id: str
    attempt: int = 1
    commit_deadline: datetime | None = None
    """The instant past which the backend must not commit this request (the latest moment it can have
    been sent, at most the lease margin after its dispatch record, plus the commit horizon); sent to
    backends configured to enforce it."""

    def commit_deadline_text(self) -> str | None:
        """`commit_deadline` as RFC 3339 UTC with milliseconds (`2026-12-01T15:40:00.123Z`)."""
        if self.commit_deadline is None:
            return None
        return self.commit_deadline.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class Outcome:
    """What an executor observed. `unknown` whenever the request may have reached the backend unanswered."""

    kind: OutcomeKind
    result: ToolResult | None = None
    error: str | None = None
    """A short machine-friendly reason such as `response_timeout`, `http_500`, `connection_lost`."""
    detail: str | None = None
    """Human-readable detail; must never contain credentials."""
    external_request_id: str | None = None
    evidence: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ReconcileResult:
    """What a lookup at the backend says about an earlier dispatch."""

    verdict: ReconcileVerdict
    result: ToolResult | None = None
    evidence: Mapping[str, Any] = field(default_factory=dict)


@runtime_checkable
class Executor(Protocol):
    """Performs effects against one backend. One instance per backend, shared by all calls."""

    async def start(self) -> None:
        """Open persistent connections; called once before the first call."""

    async def close(self) -> None:
        """Release connections."""

    async def discover(self) -> Sequence[Capability]:
        """Capabilities this backend contributes by itself (an upstream MCP server's tools); else ()."""

    async def execute(self, invocation: Invocation) -> Outcome:
        """Perform the effect once. Never raises for backend behaviour: reports it as an `Outcome`."""

    async def reconcile(self, invocation: Invocation) -> ReconcileResult:
        """Learn the truth about an earlier dispatch of `invocation`.

        Raises:
            CapabilityError: the backend offers no lookup for this capability.
        """
