"""The HTTP executor against a backend that hangs or lies, served by a raw asyncio socket server.

Every call must end within the capability's timeout in an honest outcome (a read that gets no usable
answer is `failed`; a write whose request may have reached the backend is `unknown`), with a clear
error, without following the backend anywhere and without reading an unbounded body into memory.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import time
import tracemalloc
import zlib
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pydantic_core
import pytest

from capabilities.config import parse_config
from capabilities.contract import Outcome
from capabilities.registry import Registry
from tests.capabilities.conftest import invocation

pytestmark = pytest.mark.anyio

TOKEN = "hostile-backend-s3cret"
TIMEOUT_S = 1.5
LIMIT = 256 * 1024
HUGE = 256 * 1024 * 1024
"""What the flooding backend offers to send: far more than the gateway may hold."""

Writer = asyncio.StreamWriter


@dataclass
class Hostile:
    """A backend whose every path misbehaves in its own way; counts what it saw and sent."""

    hits: Counter[str] = field(default_factory=Counter)
    requests: list[bytes] = field(default_factory=list)
    sent: Counter[str] = field(default_factory=Counter)
    url: str = ""
    silent_url: str = ""
    """A second backend that accepts connections and never reads a byte."""
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)

    async def handle(self, reader: asyncio.StreamReader, writer: Writer) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            path = head.split(b" ", 2)[1].decode().split("?")[0].strip("/")
            self.hits[path] += 1
            self.requests.append(head)
            await ROUTES[path](self, path, writer)
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
            self.tasks.discard(task)

    async def hold(self, reader: asyncio.StreamReader, writer: Writer) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        self.hits["never-read"] += 1
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            pass
        finally:
            writer.close()
            self.tasks.discard(task)

    async def flood(self, path: str, writer: Writer, status: bytes, headers: bytes = b"") -> None:
        """Promise HUGE bytes and send them as fast as the client takes them."""
        writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Length: %d\r\n" % HUGE + headers + b"\r\n")
        chunk = b"a" * (1024 * 1024)
        for _ in range(HUGE // len(chunk)):
            writer.write(chunk)
            await writer.drain()
            self.sent[path] += len(chunk)


Route = Callable[[Hostile, str, Writer], Awaitable[None]]


def reply(status: bytes, body: bytes, headers: bytes = b"") -> Route:
    async def send(hostile: Hostile, path: str, writer: Writer) -> None:
        writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Length: %d\r\n" % len(body) + headers + b"\r\n")
        writer.write(body)

    return send


async def flood_200(hostile: Hostile, path: str, writer: Writer) -> None:
    await hostile.flood(path, writer, b"200 OK", b"Content-Type: application/json\r\n")


async def flood_413(hostile: Hostile, path: str, writer: Writer) -> None:
    await hostile.flood(path, writer, b"413 Content Too Large")


async def gzip_bomb(hostile: Hostile, path: str, writer: Writer) -> None:
    """64 MB of spaces in about 64 KB on the wire (compressed a megabyte at a time, to stay small here)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    megabyte = b" " * (1024 * 1024)
    body = b"".join(packer.compress(megabyte) for _ in range(64)) + packer.flush()
    await reply(b"200 OK", body, b"Content-Encoding: gzip\r\n")(hostile, path, writer)


async def trickle(hostile: Hostile, path: str, writer: Writer) -> None:
    """A chunked body that never ends: one byte at a time, each well inside any per-read timeout."""
    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    while True:
        writer.write(b"1\r\n \r\n")
        await writer.drain()
        hostile.sent[path] += 1
        await asyncio.sleep(0.1)


async def headers_then_nothing(hostile: Hostile, path: str, writer: Writer) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n")
    await writer.drain()
    await asyncio.sleep(60)


async def close_after_request(hostile: Hostile, path: str, writer: Writer) -> None:
    return None


async def reset_mid_response(hostile: Hostile, path: str, writer: Writer) -> None:
    writer.write(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"refund_id"')
    await writer.drain()
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close -> RST
    writer.transport.abort()


async def redirect(hostile: Hostile, path: str, writer: Writer) -> None:
    location = f"{hostile.url}/stolen".encode()
    await reply(b"307 Temporary Redirect", b"", b"Location: " + location + b"\r\n")(hostile, path, writer)


ROUTES: dict[str, Route] = {
    "flood": flood_200,
    "flood-413": flood_413,
    "gzip-bomb": gzip_bomb,
    "trickle": trickle,
    "headers-then-nothing": headers_then_nothing,
    "never-read": close_after_request,  # served by the silent backend, which never reads the request
    "close": close_after_request,
    "reset": reset_mid_response,
    "redirect": redirect,
    "stolen": reply(b"200 OK", b'{"stolen": true}'),
    "nan": reply(b"200 OK", b'{"amount": NaN, "fee": Infinity, "tax": -Infinity, "big": 1e999}'),
    "deep": reply(b"200 OK", b"[" * 100_000 + b"]" * 100_000),
    "deep-parsed": reply(b"200 OK", b'{"a":' * 300 + b"1" + b"}" * 300),
    "surrogate": reply(b"200 OK", b'{"name": "\\ud800"}'),
    "html-as-json": reply(b"200 OK", b"<html>ok</html>", b"Content-Type: application/json\r\n"),
    "bad-gzip": reply(b"200 OK", b"this is not gzip", b"Content-Encoding: gzip\r\n"),
    "just-under": reply(b"200 OK", b'"' + b"x" * (LIMIT - 2) + b'"'),
    "just-over": reply(b"200 OK", b'"' + b"x" * (LIMIT - 1) + b'"'),
}


@pytest.fixture
async def hostile() -> AsyncIterator[Hostile]:
    state = Hostile()
    server = await asyncio.start_server(state.handle, "127.0.0.1", 0)
    never_read = await asyncio.start_server(state.hold, "127.0.0.1", 0)
    state.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    state.silent_url = f"http://127.0.0.1:{never_read.sockets[0].getsockname()[1]}"
    try:
        yield state
    finally:
        server.close()
        never_read.close()
        for task in list(state.tasks):
            task.cancel()


@pytest.fixture
async def registry(hostile: Hostile) -> AsyncIterator[Registry]:
    capabilities = []
    for path in ROUTES:
        for effect, method in (("write", "POST"), ("read", "GET")):
            capabilities.append(
                {
                    "id": f"{path}-{effect}",
                    "backend": "silent" if path == "never-read" else "hostile",
                    "effect": effect,
                    "input_schema": {"type": "object"},
                    "request": {"method": method, "path": f"/{path}"},
                    "reconcile": {"method": "GET", "path": "/flood"},
                    "timeout_s": TIMEOUT_S,
                }
            )
    backend = {
        "type": "http",
        "base_url": hostile.url,
        "auth": {"type": "bearer", "token_env": "HOSTILE_TOKEN"},
        "max_response_bytes": LIMIT,
    }
    silent = {**backend, "base_url": hostile.silent_url}
    built = Registry.from_config(
        parse_config({"hostile": backend, "silent": silent}, capabilities), environ={"HOSTILE_TOKEN": TOKEN}
    )
    async with built:
        yield built


async def call(registry: Registry, path: str, effect: str) -> tuple[Outcome, float]:
    cap = registry.get(f"{path}-{effect}")
    assert cap is not None
    started = time.monotonic()
    outcome = await registry.executor(cap).execute(invocation(cap, {"amount": 1}))
    return outcome, time.monotonic() - started


def assert_unknown(outcome: Outcome, error: str) -> None:
    assert (outcome.kind, outcome.error) == ("unknown", error)
    assert outcome.result is None
    assert outcome.detail and TOKEN not in outcome.detail


def assert_failed(outcome: Outcome, error: str) -> None:
    assert (outcome.kind, outcome.error) == ("failed", error)
    assert outcome.result is not None and outcome.result.is_error
    assert outcome.detail and TOKEN not in outcome.detail


# --- bodies too large to hold ------------------------------------------------------------------------


async def test_a_huge_body_is_given_up_at_the_size_limit_without_holding_it(
    registry: Registry, hostile: Hostile
) -> None:
    tracemalloc.start()
    try:
        write, write_s = await call(registry, "flood", "write")
        read, read_s = await call(registry, "flood", "read")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert_unknown(write, "response_too_large")  # the backend answered 200: it may well have acted
    assert_failed(read, "response_too_large")
    assert f"over {LIMIT} bytes" in write.detail and "max_response_bytes" in write.detail
    assert write_s < TIMEOUT_S and read_s < TIMEOUT_S
    assert peak < 32 * 1024 * 1024
    assert hostile.sent["flood"] < HUGE // 4  # the connection was dropped, not drained
    assert hostile.hits["flood"] == 2  # sent once each, never retried


async def test_a_huge_error_body_still_fails_on_its_status(registry: Registry) -> None:
    outcome, elapsed = await call(registry, "flood-413", "write")

    assert_failed(outcome, "http_413")
    assert "max_response_bytes" in outcome.detail
    assert elapsed < TIMEOUT_S


async def test_the_limit_counts_decoded_bytes_so_a_gzip_bomb_is_given_up(registry: Registry) -> None:
    tracemalloc.start()
    try:
        outcome, _ = await call(registry, "gzip-bomb", "read")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert_failed(outcome, "response_too_large")
    assert peak < 32 * 1024 * 1024


async def test_a_body_at_the_limit_is_read_and_one_byte_more_is_not(registry: Registry) -> None:
    under, _ = await call(registry, "just-under", "read")
    over, _ = await call(registry, "just-over", "read")

    assert under.kind == "completed"
    assert under.result is not None and under.result.structured == {"result": "x" * (LIMIT - 2)}
    assert_failed(over, "response_too_large")


async def test_a_lookup_answered_with_a_huge_body_is_inconclusive(registry: Registry) -> None:
    cap = registry.get("flood-write")
    assert cap is not None and cap.reconcilable

    found = await registry.executor(cap).reconcile(invocation(cap, {"amount": 1}))

    assert found.verdict == "inconclusive"
    assert found.evidence["error"] == "ResponseTooLarge"


# --- answers that never finish --------------------------------------------------------------------


@pytest.mark.parametrize("path", ["trickle", "headers-then-nothing", "never-read"])
async def test_an_answer_that_never_completes_is_bounded_by_the_capability_timeout(
    registry: Registry, hostile: Hostile, path: str
) -> None:
    write, write_s = await call(registry, path, "write")
    read, read_s = await call(registry, path, "read")

    assert_unknown(write, "response_timeout")
    assert_failed(read, "response_timeout")
    assert write.detail.endswith(f": no complete answer within {TIMEOUT_S:g}s")
    assert TIMEOUT_S - 0.1 < write_s < TIMEOUT_S + 1 and read_s < TIMEOUT_S + 1
    assert hostile.hits[path] == 2


# --- connections that end early ---------------------------------------------------------------------


@pytest.mark.parametrize("path", ["close", "reset"])
async def test_a_connection_that_ends_after_the_request_left_is_unknown_for_a_write(
    registry: Registry, hostile: Hostile, path: str
) -> None:
    write, _ = await call(registry, path, "write")
    read, _ = await call(registry, path, "read")

    assert_unknown(write, "connection_lost")
    assert_failed(read, "connection_lost")
    assert hostile.hits[path] == 2  # never re-sent on a fresh connection


# --- answers that lie about their content ---------------------------------------------------------


async def test_nan_and_infinity_are_not_json_so_the_body_comes_back_as_text(registry: Registry) -> None:
    outcome, _ = await call(registry, "nan", "read")

    assert outcome.kind == "completed"
    assert outcome.result is not None and outcome.result.structured is None
    assert outcome.result.content[0]["text"].startswith('{"amount": NaN')
    json.dumps(outcome.result.to_json(), allow_nan=False)  # what the client receives is valid JSON


async def test_a_lone_surrogate_escape_is_not_json_so_the_body_comes_back_as_text(registry: Registry) -> None:
    # It parsed to a string with no UTF-8 form, which raised when the outcome was hashed and stored.
    outcome, _ = await call(registry, "surrogate", "write")

    assert outcome.kind == "completed"
    assert outcome.result is not None and outcome.result.structured is None
    assert outcome.result.content[0]["text"] == '{"name": "\\ud800"}'
    json.dumps(outcome.result.to_json(), ensure_ascii=False).encode("utf-8")  # as the store writes it


async def test_json_nested_too_deep_to_parse_comes_back_as_text_instead_of_raising(
    registry: Registry,
) -> None:
    outcome, _ = await call(registry, "deep", "read")

    assert outcome.kind == "completed"
    assert outcome.result is not None and outcome.result.structured is None


async def test_json_parsed_but_too_deep_to_record_comes_back_as_text(registry: Registry) -> None:
    # 300 levels: Python's parser takes it, and the log's event serializer refused it ("Maximum
    # serialization depth exceeded"), so a refund the backend made answered the client an internal
    # error and stayed `dispatching` until its lease ran out.
    outcome, _ = await call(registry, "deep-parsed", "write")

    assert outcome.kind == "completed"
    assert outcome.result is not None and outcome.result.structured is None
    assert outcome.result.content[0]["text"].startswith('{"a":{"a":')
    pydantic_core.to_json(outcome.result.to_json())  # as the log's events are serialized


async def test_a_body_that_is_not_what_its_content_type_says_comes_back_as_text(registry: Registry) -> None:
    outcome, _ = await call(registry, "html-as-json", "write")

    assert outcome.kind == "completed"
    assert outcome.result is not None and outcome.result.content == (
        {"type": "text", "text": "<html>ok</html>"},
    )


async def test_a_body_its_content_encoding_cannot_decode_is_no_usable_answer(registry: Registry) -> None:
    write, _ = await call(registry, "bad-gzip", "write")
    read, _ = await call(registry, "bad-gzip", "read")

    assert_unknown(write, "undecodable_response")
    assert_failed(read, "undecodable_response")


async def test_a_redirect_is_not_followed_and_says_where_it_pointed(
    registry: Registry, hostile: Hostile
) -> None:
    write, _ = await call(registry, "redirect", "write")
    read, _ = await call(registry, "redirect", "read")

    assert hostile.hits["stolen"] == 0  # neither the credentials nor the idempotency key went there
    assert_unknown(write, "http_307")
    assert_failed(read, "http_307")
    assert write.detail == f"hostile answered 307, a redirect to {hostile.url}/stolen (not followed)"
    assert read.result is not None and "not followed" in read.result.content[0]["text"]
