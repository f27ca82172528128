"""A deadline for a client's request headers, which uvicorn does not have.

uvicorn closes a kept-alive connection that sends nothing for `timeout_keep_alive` seconds, but any
byte cancels that timer and nothing arms it again, and a new connection has no timer at all: a client
that sends its headers one byte every few seconds, or stops halfway, holds its connection (and a file
descriptor) for as long as it likes. No ASGI middleware can bound this, since the application is only
called once the headers are complete; so `writ serve` runs uvicorn's own HTTP protocol (httptools, or
h11) with one timer added. It is armed when a connection is made and when a response completes,
disarmed as soon as the next request's headers are in, and if it fires first the connection is closed,
with a 408 when the client had begun a request (an idle one is closed silently: a client that reuses
it would otherwise read the 408 as the answer to its next request).

The body is bounded by `gateway.http.body_deadline`, in the application, where a timeout can be answered.

Of uvicorn's internals this uses only `connection_made`, `data_received`, `connection_lost`,
`on_response_complete`, `loop`, `transport` and `cycle.response_complete` (the request whose headers
were parsed last, and whether it was answered); tests/gateway/http/test_header_deadline.py drives both
protocol classes through them, so an upstream rename fails there.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar, Literal

from uvicorn.protocols.http.h11_impl import H11Protocol

logger = logging.getLogger(__name__)

HttpParser = Literal["auto", "httptools", "h11"]


def _timeout_response(timeout_s: float) -> bytes:
    body = f"request headers not received within {timeout_s:g} s\n".encode()
    return (
        b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
    )


class HeaderDeadline:
    """One connection's timer: from `arm` until the request headers are in, else the connection closes."""

    def __init__(
        self,
        timeout_s: float,
        loop: asyncio.AbstractEventLoop,
        transport: asyncio.Transport,
        awaiting_headers: Callable[[], bool],
    ) -> None:
        self.timeout_s = timeout_s
        self._loop = loop
        self._transport = transport
        self._awaiting_headers = awaiting_headers
        self._timer: asyncio.TimerHandle | None = None
        self._begun = False

    def arm(self) -> None:
        """Start counting (again): a new connection, or a response just completed."""
        self.disarm()
        if not self._transport.is_closing() and self._awaiting_headers():
            self._begun = False
            self._timer = self._loop.call_later(self.timeout_s, self._expire)

    def received(self) -> None:
        """The protocol has parsed more bytes: stop counting once they completed a request's headers."""
        if self._timer is None:
            return
        if self._awaiting_headers():
            self._begun = True
        else:
            self.disarm()

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        if self._transport.is_closing() or not self._awaiting_headers():
            return
        peer = self._transport.get_extra_info("peername")
        logger.info("closing the connection from %s: no request headers within %g s", peer, self.timeout_s)
        if self._begun:
            self._transport.write(_timeout_response(self.timeout_s))
        self._transport.close()


if TYPE_CHECKING:  # both protocol classes have what the mixin uses; h11's is always installed
    _Protocol = H11Protocol
else:
    _Protocol = object


class _WithHeaderDeadline(_Protocol):
    """Mixed in before one of uvicorn's protocols: a deadline for each request's headers."""

    header_timeout_s: ClassVar[float] = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.header_deadline = HeaderDeadline(
            self.header_timeout_s, self.loop, transport, self.awaiting_headers
        )
        self.header_deadline.arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self.header_deadline.received()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self.header_deadline.arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self.header_deadline.disarm()
        super().connection_lost(exc)

    def awaiting_headers(self) -> bool:
        """No request is in progress: the next one's headers have not been parsed yet."""
        cycle = self.cycle
        return cycle is None or cycle.response_complete


class H11WithHeaderDeadline(_WithHeaderDeadline, H11Protocol):
    """uvicorn's h11 protocol, with a deadline for each request's headers."""


def _httptools_class() -> type[asyncio.Protocol] | None:
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # httptools is optional; h11 always comes with uvicorn
        return None

    class HttpToolsWithHeaderDeadline(_WithHeaderDeadline, HttpToolsProtocol):  # type: ignore[misc]
        """uvicorn's httptools protocol, with a deadline for each request's headers."""

    return HttpToolsWithHeaderDeadline


def protocol_class(parser: HttpParser, header_timeout_s: float) -> type[asyncio.Protocol]:
    """uvicorn's `http=` protocol for this parser (`auto`: httptools if installed), with the deadline.

    Raises:
        ImportError: `httptools` was asked for and is not installed.
    """
    httptools = _httptools_class() if parser != "h11" else None
    if parser == "httptools" and httptools is None:
        raise ImportError("server.http_parser: httptools is not installed (pip install httptools)")
    base = httptools or H11WithHeaderDeadline
    # A subclass per setting rather than a module-level value, so two servers in one process (tests)
    # can differ; uvicorn constructs the protocol itself and passes it no arguments of ours.
    return type(base.__name__, (base,), {"header_timeout_s": header_timeout_s})
