"""The gateway's root error and the refusals it translates into MCP or HTTP answers."""

from __future__ import annotations

from gateway.reasons import ReasonCode, http_status


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


class Refused(GatewayError):
    """Writ will not do what was asked, for a stable reason code; each face translates it in one place.

    `code` is a `ReasonCode`, or a policy rule's own reason where the current policy refused.
    """

    def __init__(self, code: ReasonCode | str, message: str) -> None:
        super().__init__(message)
        self.code = code

    @property
    def http_status(self) -> int:
        return http_status(self.code)
