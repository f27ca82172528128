"""`ClientRelay` alone: a fake request context stands in for the client's session."""

from __future__ import annotations

from typing import Any

import anyio
import mcp_types as types
import pytest

from capabilities.contract import Capability
from capabilities.mcp_midcall import refusal
from gateway.calls.actions import Redactor
from gateway.mcp.midcall import NO_BACK_CHANNEL, NOT_DECLARED, ClientRelay

pytestmark = pytest.mark.anyio

CAPABILITY = Capability(id="up.ask", version="1", tool_name="ask", backend="up", input_schema={})
ASKED = types.ElicitRequestFormParams(message="Who?", requested_schema={"type": "object", "properties": {}})


class FakeSession:
    def __init__(self, *, declared: bool = True) -> None:
        self.declared = declared
        self.can_send_request = True
        self.sent: list[Any] = []
        self.release = anyio.Event()

    async def report_progress(self, progress: float, total: float | None, message: str | None) -> None:
        await self.release.wait()
        self.sent.append(progress)

    async def send_notification(self, notification: Any, related_request_id: Any = None) -> None:
        self.sent.append(notification.params.level)

    def check_client_capability(self, capability: types.ClientCapabilities) -> bool:
        return self.declared

    async def send_request(self, request: Any, shape: Any, metadata: Any = None) -> Any:
        return types.ElicitResult(action="accept", content={"name": "Ann"})


class FakeContext:
    def __init__(self, session: FakeSession, protocol_version: str = "2025-11-25", meta: Any = None) -> None:
        self.session = session
        self.protocol_version = protocol_version
        self.meta = meta
        self.request_id = 7


def _relay(ctx: FakeContext) -> ClientRelay:
    return ClientRelay(ctx, CAPABILITY, Redactor(b"0" * 32))


async def test_the_answer_waits_until_the_progress_before_it_was_passed_on() -> None:
    session = FakeSession()
    relay = _relay(FakeContext(session))
    order: list[str] = []
    async with anyio.create_task_group() as group:
        group.start_soon(relay.progress, 1.0, 2.0, None)
        await anyio.sleep(0.01)

        async def answer() -> None:
            await relay.passed_on()
            order.append("answer")

        group.start_soon(answer)
        await anyio.sleep(0.01)
        order.append("released")
        session.release.set()
    assert order == ["released", "answer"]
    assert session.sent == [1.0]


async def test_log_messages_below_the_clients_level_are_not_passed_on() -> None:
    session = FakeSession()
    relay = _relay(FakeContext(session))  # 2025-11-25, no logging/setLevel: info and above
    for level in ("debug", "info", "error"):
        await relay.log(types.LoggingMessageNotificationParams(level=level, data="x"))  # type: ignore[arg-type]
    assert session.sent == ["info", "error"]
    assert relay.evidence() == {"logMessages": 2}


async def test_a_2026_request_without_a_log_level_hears_no_log_message() -> None:
    session = FakeSession()
    relay = _relay(FakeContext(session, "2026-07-28"))
    await relay.log(types.LoggingMessageNotificationParams(level="emergency", data="x"))
    assert session.sent == []


@pytest.mark.parametrize(
    ("session", "version", "why"),
    [
        (FakeSession(declared=False), "2025-11-25", NOT_DECLARED.format("elicitation")),
        (FakeSession(), "2026-07-28", NO_BACK_CHANNEL),
    ],
)
async def test_a_request_the_client_cannot_be_asked_is_refused_and_recorded(
    session: FakeSession, version: str, why: str
) -> None:
    relay = _relay(FakeContext(session, version))
    assert await relay.elicit(ASKED) == refusal(why)
    assert relay.evidence()["exchanges"][0]["refused"] == why
