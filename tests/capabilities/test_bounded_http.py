"""The response hook that bounds an upstream's answers: which bodies it puts behind its counter."""

from __future__ import annotations

import gzip

import httpx2
import pytest

from capabilities.bounded_http import ResponseTooLarge, bounded_responses

pytestmark = pytest.mark.anyio

LIMIT = 1000


def _response(body: bytes, headers: dict[str, str]) -> httpx2.Response:
    request = httpx2.Request("POST", "http://upstream.test/mcp")
    raw = [(name.encode(), value.encode("latin-1")) for name, value in headers.items()]
    return httpx2.Response(200, headers=raw, stream=httpx2.ByteStream(body), request=request)


async def test_a_plain_body_declared_within_the_limit_is_read_as_it_came() -> None:
    body = b'{"jsonrpc":"2.0","id":1,"result":{}}'
    response = _response(body, {"content-type": "application/json", "content-length": str(len(body))})
    stream = response.stream

    await bounded_responses(LIMIT)(response)

    assert response.stream is stream  # the transport's framing bounds it: no counter in between
    assert await response.aread() == body


@pytest.mark.parametrize(
    "headers",
    [
        {"content-length": str(LIMIT + 1)},  # declared over the limit
        {},  # no length: chunked, read until the upstream stops
        {"content-length": "1,1"},  # not one plain number
        {"content-length": "²"},  # a digit to str.isdigit, not to HTTP
    ],
)
async def test_a_body_not_declared_within_the_limit_is_counted(headers: dict[str, str]) -> None:
    response = _response(b"x" * (LIMIT + 1), {"content-type": "application/json", **headers})

    await bounded_responses(LIMIT)(response)

    with pytest.raises(ResponseTooLarge):
        await response.aread()


async def test_an_encoded_body_is_counted_decoded_whatever_length_it_declares() -> None:
    bomb = gzip.compress(b"0" * (100 * LIMIT))
    response = _response(
        bomb,
        {"content-type": "application/json", "content-encoding": "gzip", "content-length": str(len(bomb))},
    )
    assert len(bomb) < LIMIT

    await bounded_responses(LIMIT)(response)

    with pytest.raises(ResponseTooLarge):
        await response.aread()
