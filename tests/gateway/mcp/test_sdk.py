"""What Writ needs of the MCP SDK beyond its public names (`gateway/mcp/sdk.py`) is still there.

A failure here means the SDK moved something Writ relies on: its server span would lose Writ's
attributes (session, transport, peer) and the operation duration metric, or a 2025-11-25 session its
log level, its subscriptions and the list changes it is told of.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

from mcp.server import Server
from mcp.server.connection import Connection
from mcp.server.context import ServerRequestContext
from mcp.server.session import ServerSession

from gateway.mcp.sdk import connection_of, sdk_span_index, sdk_span_middleware


def test_the_sdks_server_span_middleware_is_where_writ_looks_and_on_by_default() -> None:
    kind = sdk_span_middleware()
    assert kind is not None, "mcp.server._otel.OpenTelemetryMiddleware moved: update gateway/mcp/sdk.py"
    server: Server[Any] = Server("probe")
    assert sdk_span_index(server.middleware) is not None


def test_a_requests_session_keeps_its_connection_with_state_and_an_outbound_channel() -> None:
    """The lowlevel request context has no public connection: Writ reads the session's."""
    assert "connection" not in {f.name for f in dataclasses.fields(ServerRequestContext)}, (
        "ServerRequestContext has a public connection now: use it in gateway/mcp/sdk.py"
    )
    assert "self._connection = connection" in inspect.getsource(ServerSession.__init__)
    source = inspect.getsource(Connection.__init__)
    assert "self.state" in source and "self.outbound" in source


def test_connection_of_reads_the_sessions_connection_and_tolerates_none() -> None:
    class Session:
        _connection = "the connection"

    class Ctx:
        session = Session()

    assert connection_of(Ctx()) == "the connection"
    assert connection_of(object()) is None
