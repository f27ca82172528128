"""The gateway's root error and the refusals it translates into MCP or HTTP answers."""

from __future__ import annotations


class GatewayError(Exception):
    """Root of the errors raised by the gateway package."""

    retryable: bool = False


class ConfigurationError(GatewayError):
    """The configuration file is missing, malformed, or names something that does not exist."""


class UnknownTool(GatewayError):
    """The client asked for a tool that is not registered (or not visible to it)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"Unknown tool: {name!r}")
        self.name = name


class AuthenticationError(GatewayError):
    """A bearer token was missing, malformed, forged, expired or meant for another resource."""


class ConfirmationRefused(GatewayError):
    """A confirmation answer that may not run the call: used before, expired, replayed, or rebound."""

    def __init__(self, reason: str, detail: str, tool_call_id: str | None = None) -> None:
        super().__init__(detail)
        self.reason = reason
        self.tool_call_id = tool_call_id
