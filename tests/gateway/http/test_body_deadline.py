"""The body deadline as ASGI middleware, with a fake client (receive) and server (send)."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

from gateway.http.body_deadline import BodyDeadline

pytestmark = pytest.mark.anyio

DEADLINE_S = 0.2
Message = dict[str, Any]


class Client:
    """Sends the given body chunks, `gap_s` apart, then waits `then_s` and disconnects."""

    def __init__(self, chunks: list[bytes], gap_s: float = 0.0, then_s: float = 0.0) -> None:
        self.chunks, self.gap_s, self.then_s = chunks, gap_s, then_s
        self.sent: list[Message] = []

    async def receive(self) -> Message:
        if not self.chunks:
            await anyio.sleep(self.then_s)
            return {"type": "http.disconnect"}
        await anyio.sleep(self.gap_s)
        body = self.chunks.pop(0)
        return {"type": "http.request", "body": body, "more_body": bool(self.chunks)}

    async def send(self, message: Message) -> None:
        self.sent.append(message)

    @property
    def status(self) -> int:
        return next(m["status"] for m in self.sent if m["type"] == "http.response.start")

    @property
    def answer(self) -> Any:
        return json.loads(
            b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")
        )


class Tool:
    """Reads the whole body, then acts on it (the dispatch a partial body must never reach)."""

    def __init__(self, *, wait_for_disconnect: bool = False, answer_first: bool = False) -> None:
        self.acted_on: bytes | None = None
        self.saw_disconnect = False
        self.wait_for_disconnect, self.answer_first = wait_for_disconnect, answer_first

    async def __call__(self, scope: Message, receive: Any, send: Any) -> None:
        if self.answer_first:
            await send({"type": "http.response.start", "status": 200, "headers": []})
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.acted_on = body
        if not self.answer_first:
            await send({"type": "http.response.start", "status": 200, "headers": []})
        await send(
            {"type": "http.response.body", "body": b'{"ok": true}', "more_body": self.wait_for_disconnect}
        )
        if self.wait_for_disconnect:
            self.saw_disconnect = (await receive())["type"] == "http.disconnect"
            await send({"type": "http.response.body", "body": b""})


def scope(path: str = "/mcp") -> Message:
    return {"type": "http", "method": "POST", "path": path, "headers": [], "client": ("127.0.0.1", 1)}


async def test_a_body_that_arrives_in_time_reaches_the_application_unchanged() -> None:
    tool, client = Tool(), Client([b'{"a":', b" 1}"], gap_s=DEADLINE_S / 4)
    await BodyDeadline(tool, DEADLINE_S)(scope(), client.receive, client.send)
    assert tool.acted_on == b'{"a": 1}'
    assert client.status == 200 and client.answer == {"ok": True}


async def test_a_stalled_body_on_mcp_gets_a_json_rpc_408_and_the_application_never_acts_on_it() -> None:
    tool, client = Tool(), Client([b'{"a":', b" 1}"], gap_s=DEADLINE_S * 10)
    with anyio.fail_after(DEADLINE_S * 5):
        await BodyDeadline(tool, DEADLINE_S)(scope(), client.receive, client.send)
    assert tool.acted_on is None
    assert client.status == 408
    start = next(m for m in client.sent if m["type"] == "http.response.start")
    assert (b"connection", b"close") in start["headers"]
    assert client.answer == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32600, "message": "request body not received within 0.2 s"},
    }


async def test_a_trickled_body_is_cut_at_the_deadline_however_steadily_it_comes() -> None:
    tool, client = Tool(), Client([b"x"] * 100, gap_s=DEADLINE_S / 10)
    with anyio.fail_after(DEADLINE_S * 5):
        await BodyDeadline(tool, DEADLINE_S)(scope(), client.receive, client.send)
    assert tool.acted_on is None and client.status == 408


async def test_a_stalled_body_elsewhere_gets_the_api_error_shape() -> None:
    client = Client([b"{", b"}"], gap_s=DEADLINE_S * 10)
    await BodyDeadline(Tool(), DEADLINE_S)(scope("/api/approvals/ap_1/decision"), client.receive, client.send)
    assert client.status == 408
    assert client.answer["error"] == "request_timeout"


async def test_waiting_for_the_client_to_disconnect_after_the_body_is_not_timed() -> None:
    tool, client = Tool(wait_for_disconnect=True), Client([b"{}"], then_s=DEADLINE_S * 3)
    await BodyDeadline(tool, DEADLINE_S)(scope(), client.receive, client.send)
    assert tool.acted_on == b"{}" and tool.saw_disconnect
    assert client.status == 200


async def test_a_response_already_started_is_left_unfinished_rather_than_answered_twice() -> None:
    tool, client = Tool(answer_first=True), Client([b"{", b"}"], gap_s=DEADLINE_S * 10)
    with anyio.fail_after(DEADLINE_S * 5):
        await BodyDeadline(tool, DEADLINE_S)(scope(), client.receive, client.send)
    assert tool.acted_on is None
    assert [m["type"] for m in client.sent] == ["http.response.start"]


async def test_lifespan_and_other_scopes_pass_through() -> None:
    seen: list[str] = []

    async def app(scope: Message, receive: Any, send: Any) -> None:
        seen.append(scope["type"])

    await BodyDeadline(app, DEADLINE_S)({"type": "lifespan"}, Client([]).receive, Client([]).send)
    assert seen == ["lifespan"]
