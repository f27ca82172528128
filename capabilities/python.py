"""Executor for capabilities that are Python callables (`callable: "package.module:function"`).

Sync callables run in a worker thread so they cannot stall the event loop; async ones are awaited.
Either is bounded by the capability's timeout: a callable still running then is `unknown` (it may have
acted; a read is `failed`), and a thread that cannot be stopped is left to finish on its own.
Arguments are passed as keyword arguments. The input schema, when the config gives none, is derived
from the signature with pydantic.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import anyio
import anyio.to_thread
from pydantic import PydanticUserError, TypeAdapter

from capabilities.contract import (
    Capability,
    CapabilityError,
    ConfigError,
    Invocation,
    Outcome,
    ReconcileResult,
)
from capabilities.results import text_result, unanswered_outcome, value_result


def import_callable(ref: str, *, owner: str) -> Callable[..., Any]:
    """`"package.module:function"` (dots after the colon walk attributes) -> the callable.

    Raises:
        ConfigError: the module or attribute does not exist or is not callable.
    """
    module_name, _, attr_path = ref.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{owner}: cannot import module {module_name!r} ({exc})") from exc
    for attr in attr_path.split("."):
        try:
            target = getattr(target, attr)
        except AttributeError:
            raise ConfigError(f"{owner}: module {module_name!r} has no attribute {attr_path!r}") from None
    if not callable(target):
        raise ConfigError(f"{owner}: {ref!r} is not callable")
    return cast(Callable[..., Any], target)


def schema_from_signature(func: Callable[..., Any], *, owner: str) -> dict[str, Any]:
    """A JSON Schema for the keyword arguments `func` accepts.

    Raises:
        ConfigError: pydantic cannot build a schema from the annotations.
    """
    try:
        # pydantic builds the call schema of a function at runtime; its `TypeForm` annotation says types only.
        schema = TypeAdapter(func).json_schema()  # type: ignore[arg-type]
    except (PydanticUserError, TypeError, ValueError) as exc:
        raise ConfigError(
            f"{owner}: cannot derive input_schema from the signature ({exc}); set input_schema"
        ) from exc
    schema.setdefault("type", "object")
    schema.setdefault("properties", {})
    return schema


class PythonExecutor:
    """Calls in-process functions; one instance serves every capability of a `python` backend."""

    def __init__(self, name: str, functions: Mapping[str, Callable[..., Any]] | None = None) -> None:
        self.name = name
        self._functions: dict[str, Callable[..., Any]] = dict(functions or {})

    def register(self, capability_id: str, func: Callable[..., Any]) -> None:
        self._functions[capability_id] = func

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def discover(self) -> Sequence[Capability]:
        return ()

    async def execute(self, invocation: Invocation) -> Outcome:
        """Call the function once; an exception becomes `failed` with error `exception`."""
        capability = invocation.capability
        func = self._functions.get(capability.id)
        if func is None:
            detail = f"{capability.ref} is not served by {self.name}"
            return Outcome(
                "failed", text_result(detail, is_error=True), error="unknown_capability", detail=detail
            )
        kwargs = dict(invocation.arguments)
        try:
            with anyio.fail_after(capability.timeout_s):
                if _is_async(func):
                    value = await func(**kwargs)
                else:
                    # A thread cannot be cancelled; abandoning it is what lets the timeout end the call.
                    value = await anyio.to_thread.run_sync(
                        functools.partial(func, **kwargs), abandon_on_cancel=True
                    )
        except TimeoutError:
            detail = f"{capability.ref} did not return within {capability.timeout_s:g}s"
            return unanswered_outcome(invocation, capability.effect == "read", "timeout", detail)
        except Exception as exc:  # the callable's own failure is the outcome we report
            detail = f"{type(exc).__name__}: {exc}"
            return Outcome(
                "failed",
                text_result(detail, is_error=True),
                error="exception",
                detail=detail,
                external_request_id=invocation.external_request_id,
            )
        return Outcome("completed", value_result(value), external_request_id=invocation.external_request_id)

    async def reconcile(self, invocation: Invocation) -> ReconcileResult:
        """In-process calls leave nothing to look up.

        Raises:
            CapabilityError: always.
        """
        raise CapabilityError(f"{invocation.capability.ref}: python capabilities cannot be reconciled")


def _is_async(func: Callable[..., Any]) -> bool:
    target = func
    while isinstance(target, functools.partial):
        target = target.func
    return inspect.iscoroutinefunction(target) or inspect.iscoroutinefunction(type(target).__call__)
