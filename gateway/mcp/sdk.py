"""What Writ needs of the MCP SDK that it does not make public: one place, each checked by a test.

- The SDK's own server span middleware (`mcp.server._otel.OpenTelemetryMiddleware`, on by default in
  `Server.middleware`): Writ puts its attributes inside that span, so it has to find it. mcp 2.x has
  no public name for it; if the SDK moves or renames it, `sdk_span_middleware` returns None, Writ's
  attributes go on whatever span is current, and `tests/gateway/mcp/test_sdk.py` fails.

- A request's connection (`mcp.server.connection.Connection`: its `state`, which lasts as long as a
  2025-11-25 session, and its `outbound` channel for notifications between requests). MCPServer's
  `Context.connection` is public, but the lowlevel `ServerRequestContext` Writ's handlers are given
  has only `session`, whose `ServerSession` keeps the connection as `_connection`. Writ reads it here
  alone (`connection_of`): the log level a session set, the sessions told of list changes, their
  resource subscriptions. If the SDK changes it, `connection_of` returns None: a session is then
  given `info` logs, hears no list change or resource update, and `test_sdk.py` fails.

Everything else Writ reads of a request is public: the session's client capabilities, the protocol
version, the request's `_meta`.
"""

from __future__ import annotations

from typing import Any


def sdk_span_middleware() -> type[Any] | None:
    """The class of the SDK's server span middleware, None if this SDK has none where Writ looks."""
    try:
        from mcp.server._otel import OpenTelemetryMiddleware
    except ImportError:
        return None
    return OpenTelemetryMiddleware


def sdk_span_index(middleware: list[Any]) -> int | None:
    """Where the SDK's server span middleware is in a server's `middleware`, None if not there."""
    kind = sdk_span_middleware()
    if kind is None:
        return None
    return next((i for i, m in enumerate(middleware) if isinstance(m, kind)), None)


def connection_of(ctx: Any) -> Any:
    """The request's connection (its `ServerSession`'s `_connection`); None if there is none."""
    return getattr(getattr(ctx, "session", None), "_connection", None)
