"""A size limit on the answers an `httpx2.AsyncClient` hands to code that reads them whole.

The MCP SDK's streamable HTTP transport reads a JSON answer with `response.aread()`, however long it
is (it caps each SSE event, not a plain body), so an upstream could make Writ hold gigabytes.
`bounded_responses(limit)` is a response hook for the client Writ builds for such an upstream: it
puts the body of every answer that is not an event stream behind a counter, and once more than
`limit` bytes have come, reading raises `ResponseTooLarge` and the rest is never read (the connection
is dropped when the response is closed). The count is of decoded bytes, so a small gzip body that
inflates to gigabytes is given up at its real size.

A hook rather than a wrapped transport: hooks see every response the client gets, whichever
transport carried it (a proxy from the environment gets one of its own).
"""

from __future__ import annotations

import datetime
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx2

LIMIT_SETTING = "max_response_bytes"
"""Named in every `ResponseTooLarge` message, which is how an error made of it is recognised."""


class ResponseTooLarge(httpx2.StreamError):
    """An answer's body passed the limit; the rest was not read.

    A `StreamError` because that is what the MCP SDK catches around reading a JSON answer: it then
    fails that one request with a parse error carrying this message, where any other exception would
    end the transport's task and with it the session every other call is using.
    """

    def __init__(self, status_code: int, limit: int) -> None:
        super().__init__(f"answered {status_code} with a body over {limit} bytes ({LIMIT_SETTING})")
        self.status_code = status_code
        self.limit = limit


class _BoundedBody(httpx2.AsyncByteStream):
    """The decoded body of `source`, cut off with `ResponseTooLarge` once it passes `limit` bytes."""

    def __init__(self, source: httpx2.Response, limit: int) -> None:
        self._source = source
        self._limit = limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        size = 0
        async for chunk in self._source.aiter_bytes():
            size += len(chunk)
            if size > self._limit:
                raise ResponseTooLarge(self._source.status_code, self._limit)
            yield chunk

    async def aclose(self) -> None:
        await self._source.aclose()

    @property
    def elapsed(self) -> datetime.timedelta | None:
        """What `Response.elapsed` reads from its stream (the client's own stream measures it)."""
        elapsed: datetime.timedelta | None = getattr(self._source.stream, "elapsed", None)
        return elapsed


def bounded_responses(limit: int) -> Callable[[httpx2.Response], Awaitable[None]]:
    """A response hook that bounds every body other than an event stream to `limit` decoded bytes.

    Event streams are left alone: they are long-lived by design (the SDK bounds each of their events
    instead), and the answer to one request is one event.
    """

    async def bound(response: httpx2.Response) -> None:
        content_type = response.headers.get("content-type", "")
        if content_type.partition(";")[0].strip().lower() == "text/event-stream":
            return
        if _declared_within(response, limit):
            return
        # The body is decoded here, through a response built on the same headers and raw stream, so
        # the limit counts decoded bytes; the outer response then must not decode it again.
        source = httpx2.Response(
            response.status_code, headers=response.headers, stream=response.stream, request=response.request
        )
        response.stream = _BoundedBody(source, limit)
        for name in ("content-encoding", "content-length"):
            if name in response.headers:
                del response.headers[name]

    return bound


def _declared_within(response: httpx2.Response, limit: int) -> bool:
    """Whether the body is bounded already: not encoded, with a `Content-Length` within `limit`.

    HTTP/1.1 framing (h11) and HTTP/2 (h2) hand on no more than the declared length, so such a body
    needs no counter; this spares every ordinary answer a second response object and stream.
    """
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    length = response.headers.get("content-length", "")
    return encoding == "identity" and length.isascii() and length.isdigit() and int(length) <= limit
