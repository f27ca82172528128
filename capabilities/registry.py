"""The registry: every capability Writ exposes, and the executor behind each.

Built once from config (credentials resolved, callables imported, schemas checked); `start()` opens
the executors and runs upstream discovery; an upstream that announces a changed listing is discovered
again (`rediscover`), and the new listing replaces its old one whole. Calls only look things up.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Any

import anyio
from jsonschema import SchemaError
from jsonschema.validators import validator_for

from capabilities.config import (
    CapabilitiesConfig,
    CapabilityConfig,
    HttpBackend,
    McpBackend,
    PythonBackend,
    check_horizon,
    template_fields,
)
from capabilities.contract import (
    NAME_CHARS,
    BackendUnavailable,
    Capability,
    CapabilityError,
    ConfigError,
    Executor,
)
from capabilities.credentials import resolve_credentials, resolve_env
from capabilities.http import HttpExecutor, HttpRoute
from capabilities.mcp_changes import Listing
from capabilities.mcp_upstream import McpExecutor
from capabilities.python import PythonExecutor, docstring_summary, import_callable, schema_from_signature

logger = logging.getLogger(__name__)

Changed = Callable[[Listing], Awaitable[None]]
"""Told which listing changed after the registry took an upstream's new one."""


class Registry:
    """Capabilities by tool name and by id, and one executor per backend."""

    def __init__(
        self,
        executors: Mapping[str, Executor],
        capabilities: Sequence[Capability] = (),
        *,
        reserved: frozenset[str] = frozenset(),
    ) -> None:
        self._executors = dict(executors)
        self._reserved = reserved
        self._capabilities: list[Capability] = []
        self._by_tool: dict[str, Capability] = {}
        self._by_id: dict[str, Capability] = {}
        self._by_prompt: dict[str, Capability] = {}
        self._resources: list[Capability] = []
        """Resource capabilities, one per backend that relays resources (its prefixes are disjoint)."""
        self._started: list[Executor] = []
        self._running = False
        self.relays_resources = False
        """Some backend is configured to relay resources (known before discovery: it decides what the
        MCP face advertises)."""
        self.relays_prompts = False
        self._static = list(capabilities)
        self._discovered: dict[str, list[Capability]] = {}
        """What each backend contributed at its last discovery."""
        self._listeners: list[Changed] = []
        self._rediscovering = anyio.Lock()
        self._add(capabilities)

    @classmethod
    def from_config(
        cls,
        config: CapabilitiesConfig,
        *,
        environ: Mapping[str, str] = os.environ,
        base_dir: Path | None = None,
        reserved: frozenset[str] = frozenset(),
    ) -> Registry:
        """Build executors and static capabilities from the validated sections; `reserved` are tool
        names the gateway serves itself, which no capability may take.

        Raises:
            ConfigError: a missing credential, an unimportable callable, a bad schema.
        """
        executors: dict[str, Executor] = {}
        for name, backend in config.backends.items():
            owner = f"backend {name!r}"
            if isinstance(backend, HttpBackend):
                credentials = resolve_credentials(
                    backend.auth, owner=owner, environ=environ, base_dir=base_dir
                )
                executors[name] = HttpExecutor(name, backend, credentials=credentials)
            elif isinstance(backend, McpBackend):
                credentials = resolve_credentials(
                    backend.auth, owner=owner, environ=environ, base_dir=base_dir
                )
                child_env, env_secrets = resolve_env(backend.env_from, owner=owner, environ=environ)
                credentials = replace(credentials, secrets=credentials.secrets + env_secrets)
                executors[name] = McpExecutor(
                    name, backend, credentials, child_env=child_env, base_dir=base_dir
                )
            else:
                assert isinstance(backend, PythonBackend)
                executors[name] = PythonExecutor(name, max_threads=backend.max_threads)
        static: list[Capability] = []
        for cap in config.capabilities:
            backend = config.backends[cap.backend]
            owner = f"capability {cap.id!r}"
            schema = cap.input_schema
            description = cap.description
            if isinstance(backend, PythonBackend):
                assert cap.callable is not None
                func = import_callable(cap.callable, owner=owner)
                python = executors[cap.backend]
                assert isinstance(python, PythonExecutor)
                python.register(cap.id, func)
                if schema is None:
                    schema = schema_from_signature(func, owner=owner)
                description = description or docstring_summary(func)
            else:
                assert isinstance(backend, HttpBackend) and cap.request is not None and schema is not None
                _check_path_fields(cap, schema, owner)
                http = executors[cap.backend]
                assert isinstance(http, HttpExecutor)
                http.add_route(
                    cap.id,
                    HttpRoute(cap.request, cap.idempotency_header, cap.reconcile, cap.commit_deadline_header),
                )
            _check_schema(schema, owner)
            _check_redact_fields(cap.redact, schema, owner)
            _check_lookup_fields(cap, owner)
            timeout = cap.timeout_s or (backend.timeout_s if isinstance(backend, HttpBackend) else 30.0)
            horizon = cap.commit_horizon_s or backend.commit_horizon_s
            check_horizon(owner, timeout, horizon)
            static.append(_capability(cap, schema, timeout, horizon, backend, description))
        registry = cls(executors, static, reserved=reserved)
        mcp = [b for b in config.backends.values() if isinstance(b, McpBackend)]
        registry.relays_resources = any(b.resources is not None for b in mcp)
        registry.relays_prompts = any(b.prompts is not None for b in mcp)
        return registry

    async def start(self) -> None:
        """Start every executor and add what upstreams contribute (discovery; again on a change).

        Raises:
            BackendUnavailable: an upstream could not be reached.
            ConfigError: discovery produced a duplicate tool name or id, or names unknown tools.
        """
        if self._running:
            return
        self._running = True
        try:
            for name, executor in self._executors.items():
                await executor.start()
                self._started.append(executor)
                discovered = await executor.discover()
                for capability in discovered:
                    if capability.backend != name:
                        raise ConfigError(
                            f"backend {name!r} discovered {capability.ref} for {capability.backend!r}"
                        )
                self._add(discovered)
                self._discovered[name] = list(discovered)
                if isinstance(executor, McpExecutor):
                    executor.announcements.on_list_changed(self._upstream_changed)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.close()
            raise

    def on_change(self, listener: Changed) -> None:
        """`listener` is told of each listing the registry took anew from an upstream."""
        self._listeners.append(listener)

    async def _upstream_changed(self, backend: str, listing: Listing) -> None:
        async with self._rediscovering:
            try:
                await self.rediscover(backend)
            except (BackendUnavailable, ConfigError) as exc:
                # Its last listing stays in force: a call checked against it fails at the upstream if
                # the upstream no longer takes it, which is better than tools no one checked.
                logger.error("backend %r announced new %s that Writ cannot take: %s", backend, listing, exc)
                return
        for listener in list(self._listeners):
            await listener(listing)

    async def rediscover(self, backend: str) -> None:
        """Discover one backend again and take what it offers now, checked as at startup (names,
        schemas, clashes with the other backends); nothing changes if any check fails.

        Raises:
            BackendUnavailable: the upstream could not be listed.
            ConfigError: its new listing does not pass the checks.
        """
        discovered = list(await self._executors[backend].discover())
        for capability in discovered:
            if capability.backend != backend:
                raise ConfigError(
                    f"backend {backend!r} discovered {capability.ref} for {capability.backend!r}"
                )
        ordered = [
            capability
            for name in self._executors
            for capability in (discovered if name == backend else self._discovered.get(name, []))
        ]
        fresh = Registry(self._executors, [*self._static, *ordered], reserved=self._reserved)
        self._capabilities, self._by_tool, self._by_id = fresh._capabilities, fresh._by_tool, fresh._by_id
        self._by_prompt, self._resources = fresh._by_prompt, fresh._resources
        self._discovered[backend] = discovered

    async def close(self) -> None:
        """Close started executors, last started first."""
        self._running = False
        while self._started:
            await self._started.pop().close()

    async def __aenter__(self) -> Registry:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def get(self, tool_name: str) -> Capability | None:
        """The capability exposed under this MCP tool name."""
        return self._by_tool.get(tool_name)

    def by_id(self, capability_id: str) -> Capability | None:
        """The capability with this id (as recorded in events)."""
        return self._by_id.get(capability_id)

    def capabilities(self) -> list[Capability]:
        """All tools: configured ones in config order, then discovered ones by backend."""
        return list(self._capabilities)

    def in_force(self, tool_name: str, capability_id: str) -> Capability | None:
        """The capability a recorded call would run under now: the tool (or relayed prompt) exposed
        under its name, or its backend's resource capability for a resource read."""
        recorded = self._by_id.get(capability_id)
        if recorded is not None and recorded.kind == "resource":
            return recorded
        if recorded is not None and recorded.kind == "prompt":
            return self._by_prompt.get(tool_name)
        return self._by_tool.get(tool_name)

    def prompt(self, name: str) -> Capability | None:
        """The relayed prompt shown under this name."""
        return self._by_prompt.get(name)

    def prompts(self) -> list[Capability]:
        """Every relayed prompt, by backend in config order, each in its upstream's order."""
        return list(self._by_prompt.values())

    def resource_capability(self, uri: str) -> Capability | None:
        """The resource capability of the backend whose resources include `uri` (by its prefix)."""
        for capability in self._resources:
            relay = self.relay(capability)
            prefix = relay.uri_prefix if relay is not None else None
            if prefix is not None and uri.startswith(prefix) and len(uri) > len(prefix):
                return capability
        return None

    def resource_relays(self) -> list[tuple[Capability, McpExecutor]]:
        """Each backend that relays resources: its resource capability and its executor."""
        return [(c, relay) for c in self._resources if (relay := self.relay(c)) is not None]

    def upstreams(self) -> list[McpExecutor]:
        """The executors of the upstream MCP servers, in config order."""
        return [e for e in self._executors.values() if isinstance(e, McpExecutor)]

    def relay(self, capability: Capability) -> McpExecutor | None:
        """The upstream MCP executor behind a relayed resource or prompt (None for any other)."""
        executor = self._executors.get(capability.backend)
        return executor if isinstance(executor, McpExecutor) else None

    def executor(self, capability: Capability) -> Executor:
        """The executor of the capability's backend.

        Raises:
            CapabilityError: no such backend.
        """
        try:
            return self._executors[capability.backend]
        except KeyError:
            raise CapabilityError(f"{capability.ref}: no backend {capability.backend!r}") from None

    def _add(self, capabilities: Sequence[Capability]) -> None:
        for capability in capabilities:
            if capability.backend not in self._executors:
                raise ConfigError(f"capability {capability.id!r}: unknown backend {capability.backend!r}")
            if (longest := max(len(capability.id), len(capability.tool_name))) > NAME_CHARS:
                # The store could not record a call of it (PostgreSQL refuses it, after a read ran).
                raise ConfigError(
                    f"capability {capability.id[:64]!r}...: its id or tool name is {longest} characters "
                    f"long, over the {NAME_CHARS} Writ can record"
                )
            if capability.kind != "tool":
                self._add_relayed(capability)
                continue
            if capability.tool_name in self._reserved:
                raise ConfigError(
                    f"{capability.ref}: tool name {capability.tool_name!r} is Writ's own tool; "
                    "rename it (rename: for MCP backends, tool: for others)"
                )
            clash = self._by_tool.get(capability.tool_name)
            if clash is not None:
                raise ConfigError(
                    f"tool name {capability.tool_name!r} is used by both {clash.ref} and {capability.ref}; "
                    "rename one (rename: for MCP backends, tool: for others)"
                )
            if capability.id in self._by_id:
                raise ConfigError(f"capability id {capability.id!r} is defined twice")
            self._by_tool[capability.tool_name] = capability
            self._by_id[capability.id] = capability
            self._capabilities.append(capability)

    def _add_relayed(self, capability: Capability) -> None:
        if capability.id in self._by_id:
            raise ConfigError(f"capability id {capability.id!r} is defined twice")
        if capability.kind == "prompt":
            clash = self._by_prompt.get(capability.tool_name)
            if clash is not None:
                raise ConfigError(
                    f"prompt name {capability.tool_name!r} is relayed from both backend {clash.backend!r} "
                    f"and backend {capability.backend!r}; give one a prompts.prefix or prompts.rename"
                )
            self._by_prompt[capability.tool_name] = capability
        else:
            self._resources.append(capability)
        self._by_id[capability.id] = capability


def _capability(
    cap: CapabilityConfig,
    schema: Mapping[str, Any],
    timeout_s: float,
    commit_horizon_s: float | None,
    backend: HttpBackend | PythonBackend,
    description: str,
) -> Capability:
    return Capability(
        id=cap.id,
        version=cap.version,
        tool_name=cap.tool_name,
        backend=cap.backend,
        input_schema=schema,
        effect=cap.effect,
        description=description,
        title=cap.title,
        dedupes_on_key=cap.dedupes_on_key,
        dedupe_window_s=cap.dedupe_window_s,
        timeout_s=timeout_s,
        commit_horizon_s=commit_horizon_s,
        redact=cap.redact,
        summary=cap.summary,
        reconcilable=cap.reconcile is not None,
        # Labels (description, title, summary) are left out: rewording them changes no effect.
        definition={
            "capability": cap.model_dump(mode="json", exclude={"description", "title", "summary"}),
            "backend": _backend_definition(backend),
        },
    )


def _backend_definition(backend: HttpBackend | PythonBackend) -> dict[str, Any]:
    # Header names without their values: literal headers may be credentials, and the hash is logged.
    if isinstance(backend, PythonBackend):
        return backend.model_dump(mode="json")
    return {**backend.model_dump(mode="json", exclude={"headers"}), "headers": sorted(backend.headers)}


def _check_schema(schema: Mapping[str, Any], owner: str) -> None:
    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        raise ConfigError(f"{owner}: input_schema is not a valid JSON Schema: {exc.message}") from None
    if schema.get("type") != "object":
        raise ConfigError(f"{owner}: input_schema must have type: object")


def _check_redact_fields(redact: Sequence[str], schema: Mapping[str, Any], owner: str) -> None:
    # A misspelt name redacts nothing: the value it meant would be stored, and shown, in clear.
    properties = schema.get("properties")
    if not isinstance(properties, Mapping):
        return
    unknown = [name for name in redact if name not in properties]
    if unknown:
        raise ConfigError(f"{owner}: redact names {', '.join(unknown)}, not in input_schema.properties")


def _check_lookup_fields(cap: CapabilityConfig, owner: str) -> None:
    # The reconciler has the arguments as stored: a redacted one only as its hash, which it would
    # send to the backend as if it were the value, and find nothing.
    if cap.reconcile is None:
        return
    redacted = [name for name in template_fields(cap.reconcile.path) if name in cap.redact]
    if redacted:
        raise ConfigError(
            f"{owner}: reconcile.path uses {', '.join(redacted)}, which is redacted (only its hash is kept)"
        )


def _check_path_fields(cap: CapabilityConfig, schema: Mapping[str, Any], owner: str) -> None:
    properties = schema.get("properties")
    if not isinstance(properties, Mapping):
        return
    assert cap.request is not None
    unknown = [name for name in template_fields(cap.request.path) if name not in properties]
    if unknown:
        raise ConfigError(f"{owner}: request.path uses {', '.join(unknown)}, not in input_schema.properties")
