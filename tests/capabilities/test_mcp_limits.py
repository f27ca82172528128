"""The MCP executor against a streamable HTTP upstream whose answers are too large to hold, served by a
raw asyncio socket server (so it can promise 200 MB and count what the gateway actually took).

An answer longer than the backend's `max_response_bytes` (a JSON body, decoded, or one SSE event) is
given up where it passes the limit: `response_too_large`, `unknown` for a write, `failed` for a read,
an inconclusive lookup; the session stays up for the next call.
"""

from __future__ import annotations

import asyncio
import json
import tracemalloc
import zlib
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from capabilities.config import parse_config
from capabilities.registry import Registry
from tests.capabilities.conftest import invocation
from tests.capabilities.limits import LIMIT, assert_too_large, call

pytestmark = pytest.mark.anyio

HUGE = 200 * 1024 * 1024
TIMEOUT_S = 5.0
TOOLS = ["ok", "flood", "gzip_bomb", "sse_flood", "sse_big", "just_under", "lookup_flood"]

Writer = asyncio.StreamWriter


def _result(id: Any, result: Any) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": id, "result": result}).encode()


@dataclass
class Upstream:
    """Answers initialize and tools/list properly; each tool's answer is its own kind of too much."""

    hits: Counter[str] = field(default_factory=Counter)
    sent: Counter[str] = field(default_factory=Counter)
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)

    async def handle(self, reader: asyncio.StreamReader, writer: Writer) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            method = head.split(" ", 1)[0]
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            body = await reader.readexactly(length)
            if method != "POST":
                await self.reply(writer, b"405 Method Not Allowed", b"")
                return
            await self.answer(json.loads(body), writer)
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
            self.tasks.discard(task)

    async def reply(self, writer: Writer, status: bytes, body: bytes, headers: bytes = b"") -> None:
        writer.write(
            b"HTTP/1.1 " + status + b"\r\nContent-Length: %d\r\nConnection: close\r\n" % len(body) + headers
        )
        writer.write(b"\r\n" + body)

    async def answer(self, message: dict[str, Any], writer: Writer) -> None:
        json_type = b"Content-Type: application/json\r\n"
        id, method = message.get("id"), message.get("method")
        self.hits[str(method)] += 1
        if id is None:
            await self.reply(writer, b"202 Accepted", b"")
        elif method == "initialize":
            info = {
                "protocolVersion": "2025-11-25",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "flood", "version": "1"},
            }
            await self.reply(writer, b"200 OK", _result(id, info), json_type)
        elif method == "tools/list":
            tools = [{"name": name, "inputSchema": {"type": "object"}} for name in TOOLS]
            await self.reply(writer, b"200 OK", _result(id, {"tools": tools}), json_type)
        elif method != "tools/call":
            error = {"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "no"}}
            await self.reply(writer, b"200 OK", json.dumps(error).encode(), json_type)
        else:
            name = message["params"]["name"]
            self.hits[name] += 1
            await getattr(self, name)(id, name, writer)

    async def ok(self, id: Any, name: str, writer: Writer) -> None:
        text = {"content": [{"type": "text", "text": "done"}]}
        await self.reply(writer, b"200 OK", _result(id, text), b"Content-Type: application/json\r\n")

    async def just_under(self, id: Any, name: str, writer: Writer) -> None:
        """A result that fits: the whole body is LIMIT bytes."""
        empty = _result(id, {"content": [{"type": "text", "text": ""}]})
        padded = _result(id, {"content": [{"type": "text", "text": "x" * (LIMIT - len(empty))}]})
        assert len(padded) == LIMIT
        await self.reply(writer, b"200 OK", padded, b"Content-Type: application/json\r\n")

    async def flood(self, id: Any, name: str, writer: Writer, status: bytes = b"200 OK") -> None:
        """A JSON-RPC answer that promises HUGE bytes, sent as fast as the client takes them."""
        start = b'{"jsonrpc": "2.0", "id": %s, "result": {"content": [{"type": "text", "text": "' % (
            json.dumps(id).encode()
        )
        writer.write(
            b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n" % HUGE + start
        )
        chunk = b"a" * (1024 * 1024)
        for _ in range(HUGE // len(chunk)):
            writer.write(chunk)
            await writer.drain()
            self.sent[name] += len(chunk)

    lookup_flood = flood

    async def gzip_bomb(self, id: Any, name: str, writer: Writer) -> None:
        """64 MB of spaces in about 64 KB on the wire."""
        packer = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
        megabyte = b" " * (1024 * 1024)
        body = b"".join(packer.compress(megabyte) for _ in range(64)) + packer.flush()
        headers = b"Content-Type: application/json\r\nContent-Encoding: gzip\r\n"
        await self.reply(writer, b"200 OK", body, headers)

    async def sse_flood(self, id: Any, name: str, writer: Writer) -> None:
        """An event stream whose one event never ends."""
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
            b"event: message\r\ndata: "
        )
        chunk = b"a" * (64 * 1024)
        for _ in range(HUGE // len(chunk)):
            writer.write(chunk)
            await writer.drain()
            self.sent[name] += len(chunk)

    async def sse_big(self, id: Any, name: str, writer: Writer) -> None:
        """A complete answer in one event of twice the limit (under the SDK's own 1 MiB default)."""
        event = _result(id, {"content": [{"type": "text", "text": "b" * (2 * LIMIT)}]})
        body = b"event: message\r\ndata: " + event + b"\r\n\r\n"
        await self.reply(writer, b"200 OK", body, b"Content-Type: text/event-stream\r\n")


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[Upstream, str]]:
    state = Upstream()
    server = await asyncio.start_server(state.handle, "127.0.0.1", 0)
    try:
        yield state, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/mcp"
    finally:
        server.close()
        for task in list(state.tasks):
            task.cancel()


@pytest.fixture
async def registry(upstream: tuple[Upstream, str]) -> AsyncIterator[Registry]:
    _, url = upstream
    common = {"type": "mcp", "url": url, "timeout_s": 10, "max_response_bytes": LIMIT}
    lookup = {"tool": "lookup_flood", "arguments": {"key": "{idempotency_key}"}}
    backends = {
        "w": {
            **common,
            "defaults": {"effect": "write", "timeout_s": TIMEOUT_S, "reconcile": lookup},
            "overrides": {"ok": {"effect": "read"}, "just_under": {"effect": "read"}},
        },
        "r": {
            **common,
            "tools": ["flood", "gzip_bomb", "sse_flood"],
            "rename": {name: f"read_{name}" for name in ("flood", "gzip_bomb", "sse_flood")},
            "defaults": {"effect": "read", "timeout_s": TIMEOUT_S},
        },
    }
    async with Registry.from_config(parse_config(backends, []), environ={}) as built:
        yield built


async def test_a_200_mb_json_answer_is_given_up_at_the_limit_without_holding_it(
    registry: Registry, upstream: tuple[Upstream, str]
) -> None:
    state, _ = upstream
    tracemalloc.start()
    try:
        write, write_s = await call(registry, "flood")
        read, read_s = await call(registry, "read_flood")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert_too_large(write, "unknown")  # the upstream answered: it may well have acted
    assert_too_large(read, "failed")
    assert write_s < TIMEOUT_S and read_s < TIMEOUT_S
    assert peak < 32 * 1024 * 1024
    assert state.sent["flood"] < HUGE // 4  # the connection was dropped, not drained
    assert state.hits["flood"] == 2  # sent once each, never retried

    ok, _ = await call(registry, "ok")  # the session was not given up with the answer
    assert ok.kind == "completed"
    assert state.hits["initialize"] == 2  # one session per backend, never reopened


async def test_the_limit_counts_decoded_bytes_so_a_gzip_bomb_is_given_up(registry: Registry) -> None:
    tracemalloc.start()
    try:
        write, _ = await call(registry, "gzip_bomb")
        read, _ = await call(registry, "read_gzip_bomb")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert_too_large(write, "unknown")
    assert_too_large(read, "failed")
    assert peak < 32 * 1024 * 1024


async def test_one_sse_event_over_the_limit_is_given_up_too(
    registry: Registry, upstream: tuple[Upstream, str]
) -> None:
    state, _ = upstream

    write, _ = await call(registry, "sse_flood")
    read, _ = await call(registry, "read_sse_flood")
    big, _ = await call(registry, "sse_big")

    assert_too_large(write, "unknown")
    assert_too_large(read, "failed")
    assert_too_large(big, "unknown")
    assert state.sent["sse_flood"] < HUGE // 4
    ok, _ = await call(registry, "ok")
    assert ok.kind == "completed" and state.hits["initialize"] == 2


async def test_an_answer_of_exactly_the_limit_is_read(registry: Registry) -> None:
    outcome, _ = await call(registry, "just_under")

    assert outcome.kind == "completed"
    assert outcome.result is not None
    assert outcome.result.content[0]["text"] == "x" * len(outcome.result.content[0]["text"])
    assert len(outcome.result.content[0]["text"]) > LIMIT - 100


async def test_a_lookup_answered_with_a_huge_body_is_inconclusive(registry: Registry) -> None:
    cap = registry.get("flood")
    assert cap is not None and cap.reconcilable

    found = await registry.executor(cap).reconcile(invocation(cap, {"amount": 1}))

    assert found.verdict == "inconclusive"
    assert found.evidence["error"] == "response_too_large"
