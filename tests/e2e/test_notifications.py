"""Webhook notifications of pending approvals, from the outbox to a real local HTTP receiver, by the whole
gateway served in this process (`inproc.writ`, one per case for its own webhook; the CLI run by its own
`main`)."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gateway.audit.checkpoints import parse, read_all, trusted_keys
from gateway.calls.outbox import verify
from tests.e2e.harness import Backend, Gateway
from tests.e2e.test_approvals import request_refund
from tests.eventually import eventually
from tests.gateway.mcp import inproc

pytestmark = pytest.mark.anyio

SECRET = "test-webhook-secret"


@dataclass
class Receiver:
    """Answers 503 to the first `failures` deliveries, then 200; remembers every request."""

    failures: int
    url: str = ""
    received: list[dict[str, Any]] = field(default_factory=list)

    def answer(self, headers: dict[str, str], body: bytes) -> int:
        self.received.append({"headers": headers, "body": body})
        return 503 if len(self.received) <= self.failures else 200


@contextlib.contextmanager
def receiver(failures: int) -> Iterator[Receiver]:
    state = Receiver(failures)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (the http.server naming)
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            status = state.answer({k.lower(): v for k, v in self.headers.items()}, body)
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hooks/writ"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def resent(hook: Receiver) -> dict[str, Any] | None:
    """The first delivery's message received again, if it was."""
    if not hook.received:
        return None
    first, *later = hook.received
    delivery = first["headers"]["x-writ-delivery"]
    return next((r for r in later if r["headers"]["x-writ-delivery"] == delivery), None)


@contextlib.contextmanager
def notifying_gateway(
    tmp_path: Path, backend: Backend, hook: Receiver, monkeypatch: pytest.MonkeyPatch, **webhook: Any
) -> Iterator[Gateway]:
    monkeypatch.setenv("WRIT_WEBHOOK_SECRET", SECRET)
    approvals = {
        "poll_interval_s": 0.2,
        "webhook": {"url": hook.url, "backoff_initial_s": 0.2, "backoff_max_s": 1, **webhook},
    }
    with inproc.writ(
        tmp_path, backend, f"sqlite:///{tmp_path / 'writ.db'}", overrides={"approvals": approvals}
    ) as gateway:
        yield gateway


async def test_a_pending_approval_is_announced_by_a_signed_webhook_retried_until_delivered(
    tmp_path: Path, inproc_sqlite_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = inproc_sqlite_backend
    with receiver(failures=1) as hook, notifying_gateway(tmp_path, backend, hook, monkeypatch) as gateway:
        pending = await request_refund(gateway, "hooked")
        await eventually(lambda: "delivered" in gateway.cli("approvals", "outbox").stdout)
        listing = gateway.cli("approvals", "outbox").stdout

    assert "attempts=2" in listing and "error=-" in listing
    first, second = hook.received[:2]
    assert first["body"] == second["body"]  # the same message again: at least once, one delivery id
    assert first["headers"]["x-writ-delivery"] == second["headers"]["x-writ-delivery"]
    headers, body = second["headers"], second["body"]
    assert verify(SECRET.encode(), headers["x-writ-timestamp"], body, headers["x-writ-signature"])
    assert not verify(b"other-secret", headers["x-writ-timestamp"], body, headers["x-writ-signature"])
    note = json.loads(body)
    assert note["type"] == "approval.required"
    assert (note["approvalId"], note["toolCallId"]) == (pending["approvalId"], pending["toolCallId"])
    assert note["summary"] == "refund 250 EUR to order 1002"
    assert (note["capability"], note["requester"], note["approverRole"]) == (
        "refund-order@2",
        "alice",
        "approver",
    )
    assert note["rule"] == "refunds-over-100-need-approval"
    assert note["console"].endswith(f"/console/approvals/{pending['approvalId']}")


async def test_a_webhook_that_keeps_failing_is_visible_and_given_up_after_its_attempts(
    tmp_path: Path, inproc_sqlite_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = inproc_sqlite_backend
    with (
        receiver(failures=1000) as hook,
        notifying_gateway(tmp_path, backend, hook, monkeypatch, max_attempts=3) as gateway,
    ):
        await request_refund(gateway, "unheard")
        await eventually(lambda: "dead" in gateway.cli("approvals", "outbox").stdout)
        listing = gateway.cli("approvals", "outbox", "--status", "dead").stdout

    assert "attempts=3" in listing and "error=http 503" in listing
    assert len(hook.received) == 3


async def test_checkpoints_are_sent_to_their_own_webhook_signed_and_verifiable_by_the_public_key(
    tmp_path: Path, inproc_sqlite_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WRIT_WEBHOOK_SECRET", SECRET)
    monkeypatch.setenv("WRIT_CHECKPOINT_SECRET", "checkpoint-secret")
    with receiver(failures=1) as approvals_hook, receiver(failures=1) as checkpoints_hook:
        checkpoints = {
            "enabled": True,
            "every_events": 1,
            "every_s": 0.5,
            "directory": str(tmp_path / "checkpoints"),
            "key_file": str(tmp_path / "checkpoint-key.jwk"),
            "trusted_keys": str(tmp_path / "checkpoint-keys.jwks"),
            "webhook": {
                "url": checkpoints_hook.url,
                "secret_env": "WRIT_CHECKPOINT_SECRET",
                "backoff_initial_s": 0.2,
            },
        }
        overrides = {
            "approvals": {
                "poll_interval_s": 0.2,
                "webhook": {"url": approvals_hook.url, "backoff_initial_s": 0.2},
            },
            "audit": {"checkpoints": checkpoints},
            "workers": {"interval_s": 0.2},
        }
        with inproc.writ(
            tmp_path, inproc_sqlite_backend, f"sqlite:///{tmp_path / 'writ.db'}", overrides=overrides
        ) as gateway:
            pending = await request_refund(gateway, "anchored")
            await eventually(
                lambda: resent(checkpoints_hook) is not None and len(approvals_hook.received) >= 2
            )
            head, _ = gateway.runtime.store.log_head()
            listing = gateway.cli("approvals", "outbox").stdout

    keys = trusted_keys(tmp_path / "checkpoint-keys.jwks")
    sent = [json.loads(r["body"]) for r in checkpoints_hook.received]
    for request in checkpoints_hook.received:
        headers = request["headers"]
        assert verify(
            b"checkpoint-secret", headers["x-writ-timestamp"], request["body"], headers["x-writ-signature"]
        )
    assert {note["type"] for note in sent} == {"audit.checkpoint"}
    made = [parse(note["checkpoint"], keys, "webhook") for note in sent]
    assert [m.anchor.seq for m in made] == [note["seq"] for note in sent]
    on_disk = {line for c in read_all([tmp_path / "checkpoints"], keys) for line in c.lines}
    assert {line for m in made for line in m.lines} <= on_disk  # the same signed lines as in the directory
    assert max(m.anchor.seq for m in made) <= head
    assert "topic=audit.checkpoint" in listing and f"approval={pending['approvalId']}" in listing
    again = resent(checkpoints_hook)  # the first answer was 503: sent again, the same message
    assert again is not None and again["body"] == checkpoints_hook.received[0]["body"]
    # Each webhook carries its own messages only.
    assert {json.loads(r["body"])["type"] for r in approvals_hook.received} == {"approval.required"}
    assert json.loads(approvals_hook.received[-1]["body"])["approvalId"] == pending["approvalId"]
