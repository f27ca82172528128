"""The header deadline on uvicorn's own protocol classes (httptools and h11), fed bytes by a fake transport.

These drive the uvicorn internals `gateway.http.header_deadline` relies on (`connection_made`,
`data_received`, `on_response_complete`, `connection_lost`, `cycle.response_complete`): if uvicorn
renames one, a deadline here stops firing or fires mid-request, and a test below fails.
"""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import pytest
import uvicorn
from uvicorn.server import ServerState

from gateway.http.header_deadline import protocol_class
from tests.eventually import eventually

pytestmark = pytest.mark.anyio

DEADLINE_S = 0.2
PARSERS = ["httptools", "h11"]
REQUEST = b"GET /x HTTP/1.1\r\nHost: writ.test\r\n\r\n"


class FakeTransport(asyncio.Transport):
    """Records what the protocol writes; closing it tells the protocol, as a socket's transport does."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.loop = loop
        self.protocol: asyncio.Protocol | None = None
        self.written = bytearray()
        self.closed = asyncio.Event()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def close(self) -> None:
        if not self.closed.is_set():
            self.closed.set()
            if self.protocol is not None:
                self.loop.call_soon(self.protocol.connection_lost, None)

    def is_closing(self) -> bool:
        return self.closed.is_set()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 40000), "sockname": ("127.0.0.1", 8080)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class App:
    """Answers each request with 200 once `release` is set (at once, by default)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.release.set()
        self.requests = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.requests += 1
        while (await receive()).get("more_body"):
            pass
        await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})


async def connection(parser: str, app: App) -> FakeTransport:
    loop = asyncio.get_running_loop()
    protocol_type = protocol_class(parser, DEADLINE_S)  # type: ignore[arg-type]
    config = uvicorn.Config(
        app,
        http=protocol_type,
        ws="none",
        lifespan="off",
        timeout_keep_alive=60,
        log_config=None,
        access_log=False,
    )
    config.load()
    protocol = protocol_type(config=config, server_state=ServerState(), app_state={}, _loop=loop)  # type: ignore[call-arg]
    transport = FakeTransport(loop)
    transport.protocol = protocol
    protocol.connection_made(transport)
    return transport


async def closed_within(transport: FakeTransport, seconds: float) -> bool:
    with anyio.move_on_after(seconds):
        await transport.closed.wait()
    return transport.closed.is_set()


@pytest.mark.parametrize("parser", PARSERS)
async def test_headers_that_stop_halfway_get_408_and_the_connection_closes_at_the_deadline(
    parser: str,
) -> None:
    app = App()
    transport = await connection(parser, app)
    transport.protocol.data_received(REQUEST[:20])  # type: ignore[union-attr]
    start = anyio.current_time()
    assert await closed_within(transport, 5)
    assert anyio.current_time() - start >= DEADLINE_S * 0.9
    assert bytes(transport.written).startswith(b"HTTP/1.1 408 Request Timeout\r\n")
    assert b"connection: close" in transport.written
    assert app.requests == 0


@pytest.mark.parametrize("parser", PARSERS)
async def test_a_connection_that_sends_nothing_is_closed_at_the_deadline_without_an_answer(
    parser: str,
) -> None:
    transport = await connection(parser, App())
    assert await closed_within(transport, 5)
    assert transport.written == b""


@pytest.mark.parametrize("parser", PARSERS)
async def test_each_byte_in_time_does_not_extend_the_deadline(parser: str) -> None:
    transport = await connection(parser, App())
    start = anyio.current_time()
    for byte in REQUEST[:-1]:
        if transport.closed.is_set():
            break
        transport.protocol.data_received(bytes([byte]))  # type: ignore[union-attr]
        await closed_within(transport, DEADLINE_S / 4)
    assert transport.closed.is_set()
    assert anyio.current_time() - start < DEADLINE_S * 3
    assert bytes(transport.written).startswith(b"HTTP/1.1 408 ")


@pytest.mark.parametrize("parser", PARSERS)
async def test_complete_headers_stop_the_deadline_while_the_request_is_served(parser: str) -> None:
    app = App()
    app.release.clear()
    transport = await connection(parser, app)
    transport.protocol.data_received(REQUEST)  # type: ignore[union-attr]
    assert not await closed_within(transport, DEADLINE_S * 3)
    app.release.set()
    await eventually(lambda: b"ok" in transport.written, within_s=5)
    assert bytes(transport.written).startswith(b"HTTP/1.1 200 OK\r\n")


@pytest.mark.parametrize("parser", PARSERS)
async def test_a_kept_alive_connection_gets_the_deadline_again_after_each_response(parser: str) -> None:
    app = App()
    transport = await connection(parser, app)
    for _ in range(3):  # longer than the deadline together, each inside it
        transport.protocol.data_received(REQUEST)  # type: ignore[union-attr]
        assert not await closed_within(transport, DEADLINE_S / 2)
    assert app.requests == 3 and transport.written.count(b"HTTP/1.1 200 OK") == 3
    transport.protocol.data_received(REQUEST[:10])  # type: ignore[union-attr]
    assert await closed_within(transport, 5)
    assert transport.written.endswith(b"request headers not received within 0.2 s\n")
