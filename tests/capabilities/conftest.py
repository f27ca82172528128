"""Fixtures: real servers, and invocations to send them."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from capabilities.contract import Capability, Invocation
from tests.capabilities.servers import ServerState, http_backend_app, mcp_upstream_server, serve


@pytest.fixture
def backend_state() -> ServerState:
    return ServerState()


@pytest.fixture
def backend_url(backend_state: ServerState) -> Iterator[str]:
    with serve(http_backend_app(backend_state), backend_state) as url:
        yield url


@pytest.fixture
def upstream_state() -> ServerState:
    return ServerState()


@pytest.fixture
def upstream_url(upstream_state: ServerState) -> Iterator[str]:
    app = mcp_upstream_server(upstream_state).streamable_http_app()
    with serve(app, upstream_state) as url:
        yield f"{url}/mcp"


def invocation(
    capability: Capability, arguments: Mapping[str, Any] | None = None, **fields: Any
) -> Invocation:
    """A fresh dispatch of `capability` with new ids unless given."""
    fields.setdefault("idempotency_key", f"key-{uuid.uuid4().hex[:12]}")
    fields.setdefault("tool_call_id", f"tc-{uuid.uuid4().hex[:12]}")
    fields.setdefault("external_request_id", f"req-{uuid.uuid4().hex[:12]}")
    return Invocation(capability=capability, arguments=dict(arguments or {}), **fields)
