"""Executor for capabilities that are Python callables (`callable: "package.module:function"`).

Sync callables run in a worker thread so they cannot stall the event loop; async ones are awaited.
Either is bounded by the capability's timeout: a callable still running then is `unknown` (it may have
acted; a read is `failed`), and a thread that cannot be stopped is left to finish on its own.

Each backend runs its sync callables on a pool of its own of at most `max_threads` threads, so
callables that always hang hold at most that many threads, instead of one more per call. A call that
finds them all busy waits in line within its own timeout; if none frees in time it never starts and
is `failed` with `threads_busy` (nothing ran, so even a write is not `unknown`). A pool rather than
anyio's worker threads behind a `CapacityLimiter`: anyio gives the limiter's token back when it
abandons a thread, so a limiter alone would not count the threads that hung callables still hold.

Arguments are passed as keyword arguments. The input schema, when the config gives none, is derived
from the signature with pydantic.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import importlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, cast

import anyio
from pydantic import PydanticUserError, TypeAdapter

from capabilities.contract import (
    Capability,
    CapabilityError,
    ConfigError,
    Invocation,
    Outcome,
    ReconcileResult,
)
from capabilities.results import failed_outcome, text_result, unanswered_outcome, value_result

DEFAULT_MAX_THREADS = 8


def import_callable(ref: str, *, owner: str) -> Callable[..., Any]:
    """`"package.module:function"` (dots after the colon walk attributes) -> the callable.

    Raises:
        ConfigError: the module or attribute does not exist or is not callable.
    """
    module_name, _, attr_path = ref.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"{owner}: cannot import module {module_name!r} ({exc}); it is imported as Python imports "
            "any module, from the installed packages and $PYTHONPATH, not from the config's directory"
        ) from exc
    for attr in attr_path.split("."):
        try:
            target = getattr(target, attr)
        except AttributeError:
            raise ConfigError(f"{owner}: module {module_name!r} has no attribute {attr_path!r}") from None
    if not callable(target):
        raise ConfigError(f"{owner}: {ref!r} is not callable")
    return cast(Callable[..., Any], target)


def docstring_summary(func: Callable[..., Any]) -> str:
    """The first paragraph of `func`'s docstring, on one line: the tool's description when the config
    gives none, as a model reads a tool's description to choose it."""
    doc = inspect.getdoc(func) or ""
    return " ".join(doc.split("\n\n", 1)[0].split())


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

    def __init__(
        self,
        name: str,
        functions: Mapping[str, Callable[..., Any]] | None = None,
        *,
        max_threads: int = DEFAULT_MAX_THREADS,
    ) -> None:
        self.name = name
        self._functions: dict[str, Callable[..., Any]] = dict(functions or {})
        self._max_threads = max_threads
        self._threads: ThreadPoolExecutor | None = None
        """Made on first use; its threads are the only ones this backend's callables run on."""

    def register(self, capability_id: str, func: Callable[..., Any]) -> None:
        self._functions[capability_id] = func

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        """Drop calls still waiting for a thread; threads held by hung callables end when they return."""
        threads, self._threads = self._threads, None
        if threads is not None:
            threads.shutdown(wait=False, cancel_futures=True)

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
        queued: Future[Any] | None = None
        try:
            with anyio.fail_after(capability.timeout_s):
                if _is_async(func):
                    value = await func(**kwargs)
                else:
                    # A thread cannot be cancelled; abandoning it is what lets the timeout end the call.
                    context = contextvars.copy_context()
                    queued = self._pool().submit(context.run, functools.partial(func, **kwargs))
                    value = await asyncio.wrap_future(queued)
        except TimeoutError:
            if queued is not None and queued.cancel():
                # Still in line for a thread, so it never ran and now never will.
                detail = (
                    f"{capability.ref} did not start within {capability.timeout_s:g}s: all "
                    f"{self._max_threads} threads of python backend {self.name!r} (max_threads) are held "
                    "by calls that have not returned; nothing ran"
                )
                return failed_outcome(invocation, "threads_busy", detail)
            detail = f"{capability.ref} did not return within {capability.timeout_s:g}s"
            return unanswered_outcome(invocation, capability.effect == "read", "timeout", detail)
        except (Exception, SystemExit, KeyboardInterrupt, GeneratorExit) as exc:
            # The callable's own failure is the outcome we report. `sys.exit()` in a callable (or
            # KeyboardInterrupt, GeneratorExit) is raised from its thread or task, never from Writ:
            # it went past this, failed the request with a bare 500 and left the call dispatching.
            detail = f"{type(exc).__name__}: {exc}"
            return Outcome(
                "failed",
                text_result(detail, is_error=True),
                error="exception",
                detail=detail,
                external_request_id=invocation.external_request_id,
            )
        return Outcome("completed", value_result(value), external_request_id=invocation.external_request_id)

    def _pool(self) -> ThreadPoolExecutor:
        if self._threads is None:
            self._threads = ThreadPoolExecutor(
                self._max_threads, thread_name_prefix=f"writ-python-{self.name}"
            )
        return self._threads

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
