"""A scripted executor for other packages' unit tests (the e2e tests use the real executors)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import anyio

from capabilities.contract import (
    Capability,
    CapabilityError,
    EffectClass,
    Invocation,
    Outcome,
    ReconcileResult,
    ToolResult,
)
from capabilities.results import json_result

Step = Outcome | Exception | Callable[[Invocation], Outcome]
"""One scripted answer: an outcome, an exception to raise, or a function of the invocation."""


def completed(value: Any = None, **evidence: Any) -> Outcome:
    """A `completed` outcome whose result is `value` as JSON ({"ok": true} by default)."""
    return Outcome("completed", json_result({"ok": True} if value is None else value), evidence=evidence)


def failed(error: str = "http_400", detail: str = "rejected") -> Outcome:
    return Outcome("failed", ToolResult(({"type": "text", "text": detail},), is_error=True), error, detail)


def unknown(error: str = "response_timeout", detail: str = "no answer") -> Outcome:
    return Outcome("unknown", error=error, detail=detail)


def fake_capability(
    tool_name: str = "refund_order",
    *,
    backend: str = "fake",
    effect: EffectClass = "write",
    version: str = "1",
    **fields: Any,
) -> Capability:
    """A capability with a permissive object schema, for tests that need one quickly."""
    fields.setdefault("id", tool_name.replace("_", "-"))
    fields.setdefault("input_schema", {"type": "object"})
    return Capability(tool_name=tool_name, backend=backend, effect=effect, version=version, **fields)


class FakeExecutor:
    """Answers `execute` from a script (then `default`), and records every invocation.

    `delay_s` makes each call take that long (to test timeouts and concurrency in callers);
    `gate`, when set, makes each call wait for the event first.
    """

    def __init__(
        self,
        script: Iterable[Step] = (),
        *,
        default: Step | None = None,
        reconcile_script: Iterable[ReconcileResult | Exception] = (),
        capabilities: Sequence[Capability] = (),
        delay_s: float = 0.0,
    ) -> None:
        self.script: deque[Step] = deque(script)
        self.default: Step = default if default is not None else completed()
        self.reconcile_script: deque[ReconcileResult | Exception] = deque(reconcile_script)
        self.discovered = tuple(capabilities)
        self.delay_s = delay_s
        self.gate: anyio.Event | None = None
        self.invocations: list[Invocation] = []
        self.reconciled: list[Invocation] = []
        self.started = False
        self.closed = False

    def then(self, *steps: Step) -> FakeExecutor:
        """Append steps to the script; returns self for chaining."""
        self.script.extend(steps)
        return self

    async def start(self) -> None:
        self.started = True

    async def close(self) -> None:
        self.closed = True

    async def discover(self) -> Sequence[Capability]:
        return self.discovered

    async def execute(self, invocation: Invocation) -> Outcome:
        self.invocations.append(invocation)
        if self.gate is not None:
            await self.gate.wait()
        if self.delay_s:
            await anyio.sleep(self.delay_s)
        step = self.script.popleft() if self.script else self.default
        if isinstance(step, Exception):
            raise step
        outcome = step(invocation) if callable(step) else step
        if outcome.external_request_id is None:
            outcome = _with_request_id(outcome, invocation.external_request_id)
        return outcome

    async def reconcile(self, invocation: Invocation) -> ReconcileResult:
        self.reconciled.append(invocation)
        if not self.reconcile_script:
            raise CapabilityError(f"{invocation.capability.ref}: no reconcile answer scripted")
        step = self.reconcile_script.popleft()
        if isinstance(step, Exception):
            raise step
        return step

    def calls_for(self, tool_name: str) -> list[Mapping[str, Any]]:
        """The arguments of every invocation of `tool_name`, in order."""
        return [inv.arguments for inv in self.invocations if inv.capability.tool_name == tool_name]


def _with_request_id(outcome: Outcome, request_id: str) -> Outcome:
    return Outcome(
        outcome.kind, outcome.result, outcome.error, outcome.detail, request_id, dict(outcome.evidence)
    )
