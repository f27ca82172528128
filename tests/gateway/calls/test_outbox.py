"""Webhook signing and retry timing, the parts of delivery a receiver and an operator rely on."""

from __future__ import annotations

from datetime import UTC, datetime

import anyio
import httpx2
import pytest
from anyio.abc import SocketAttribute, SocketStream

from gateway.calls.approvals import WebhookConfig
from gateway.calls.outbox import Notifier, backoff, sign, verify
from store.model import OutboxMessage
from tests.fakes import FakeOutbox


def test_a_signature_covers_the_timestamp_and_the_exact_body() -> None:
    signature = sign(b"secret", "1764500000", b'{"a":1}')

    assert signature.startswith("sha256=")
    assert verify(b"secret", "1764500000", b'{"a":1}', signature)
    assert not verify(b"secret", "1764500001", b'{"a":1}', signature)
    assert not verify(b"secret", "1764500000", b'{"a":2}', signature)
    assert not verify(b"other", "1764500000", b'{"a":1}', signature)


def test_retries_back_off_exponentially_up_to_the_cap() -> None:
    config = WebhookConfig(url="http://x", backoff_initial_s=1, backoff_max_s=30)

    assert [backoff(config, n) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]


class _Hang(httpx2.AsyncBaseTransport):
    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        await anyio.sleep(3600)
        raise AssertionError("unreachable")


def _message() -> OutboxMessage:
    now = datetime(2026, 12, 1, tzinfo=UTC)
    return OutboxMessage(
        message_id="msg_1",
        topic="approval.required",
        tenant="acme",
        approval_id="ap_1",
        tool_call_id="tc_1",
        payload={},
        status="pending",
        attempts=1,
        next_attempt_at=now,
        created_at=now,
    )


async def _trickle(stream: SocketStream) -> None:
    """A real receiver that answers its status line a byte at a time, each well inside timeout_s."""
    async with stream:
        await stream.receive()
        for byte in b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * 10_000:
            await stream.send(bytes([byte]))
            await anyio.sleep(0.05)


async def _deliver_through(transport: httpx2.AsyncBaseTransport | None, url: str) -> tuple[bool, FakeOutbox]:
    outbox = FakeOutbox()
    notifier = Notifier(
        store=outbox,
        webhook=WebhookConfig(url=url, timeout_s=0.3),
        secret=b"s",
        clock=lambda: datetime.now(UTC),
        owner="me",
        console_url="http://writ/console",
    )
    async with httpx2.AsyncClient(timeout=0.3, transport=transport) as http:
        with anyio.fail_after(5):
            return await notifier.deliver(http, _message()), outbox


@pytest.mark.anyio
async def test_a_receiver_that_trickles_its_answer_fails_the_delivery_within_timeout_s() -> None:
    # httpx2's timeout bounds each read, not the answer: a receiver sending a byte a second held the
    # outbox, and every later approval's notification waited behind it.
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, _trickle)
        delivered, outbox = await _deliver_through(None, f"http://127.0.0.1:{port}/hook")
        tg.cancel_scope.cancel()

    assert not delivered and outbox.delivered == []
    assert [f.error for f in outbox.failed] == ["no complete answer within 0.3s (timeout_s)"]


@pytest.mark.anyio
async def test_a_receiver_that_never_answers_fails_the_delivery_within_timeout_s() -> None:
    delivered, outbox = await _deliver_through(_Hang(), "http://receiver.test/hook")

    assert not delivered
    assert [f.error for f in outbox.failed] == ["no complete answer within 0.3s (timeout_s)"]
