"""The MCP face over a pipeline, in memory: for cases that talk to it with `mcp.Client(server)`."""

from __future__ import annotations

from typing import Any

from mcp.server import Server

from capabilities.registry import Registry
from gateway.calls.actions import Redactor
from gateway.calls.catalogue import Catalogue
from gateway.calls.pipeline import CallPipeline
from gateway.clock import system_clock
from gateway.mcp.server import build_mcp_server
from gateway.telemetry import Telemetry
from policy.engine import Policy
from policy.model import Principal
from store.store import Store


def face(
    store: Store,
    registry: Registry,
    policy: Policy,
    principal: Principal,
    *,
    pipeline: type[CallPipeline] = CallPipeline,
    telemetry: Telemetry | None = None,
    relays: bool = False,
    **settings: Any,
) -> Server[Any]:
    """`build_mcp_server` as the composition root calls it, over a `pipeline` of this class built with
    `settings` (a redactor of its own unless given); `relays` serves the registry's resources/prompts."""
    settings.setdefault("redactor", Redactor(b"s"))
    calls = pipeline(store=store, registry=registry, policy=lambda: policy, **settings)
    return build_mcp_server(
        calls,
        Catalogue(registry, lambda: policy),
        store,
        lambda: principal,
        clock=system_clock,
        telemetry=telemetry,
        registry=registry if relays else None,
    )
