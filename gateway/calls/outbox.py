"""Webhook notifications of pending approvals, delivered from the store's transactional outbox.

The message is written in the transaction that records `approval.required`, so no approval goes
unannounced, whatever crashes. Any replica may deliver: a claim is a lease in the store. Delivery is at
least once (a receiver deduplicates on `X-Writ-Delivery`), retried with exponential backoff; after
`max_attempts` a message is `dead`, and `writ approvals outbox` shows every failing or dead message.

Signature: `X-Writ-Signature: sha256=<hex>` is HMAC-SHA256 with the shared secret over
`<X-Writ-Timestamp>.<raw body>`; receivers should also refuse stale timestamps.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import anyio
import anyio.to_thread
import httpx2

from gateway.calls.approvals import WebhookConfig
from store.canonical import canonical_json
from store.commands import ClaimOutbox, OutboxDelivered, OutboxFailed
from store.model import OutboxMessage
from store.ports import Outbox
from store.queues import TOPIC_APPROVAL_REQUIRED

logger = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Writ-Signature"
TIMESTAMP_HEADER = "X-Writ-Timestamp"
DELIVERY_HEADER = "X-Writ-Delivery"


def sign(secret: bytes, timestamp: str, body: bytes) -> str:
    """The signature header's value for `body` sent at `timestamp` (unix seconds, as text)."""
    mac = hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"sha256={mac}"


def verify(secret: bytes, timestamp: str, body: bytes, signature: str) -> bool:
    """What a receiver checks (constant time)."""
    return hmac.compare_digest(sign(secret, timestamp, body), signature)


def backoff(config: WebhookConfig, attempts: int) -> float:
    """Seconds before the next attempt after `attempts` failed ones: doubling, capped."""
    return min(config.backoff_initial_s * 2.0 ** max(attempts - 1, 0), config.backoff_max_s)


class Notifier:
    """Claims due outbox messages of its `topics` and POSTs them to the webhook, one pass per tick
    (approvals by default; `audit.checkpoint` for the checkpoints' webhook)."""

    def __init__(
        self,
        *,
        store: Outbox,
        webhook: WebhookConfig,
        secret: bytes,
        clock: Callable[[], datetime],
        owner: str,
        console_url: str,
        transport: httpx2.AsyncBaseTransport | None = None,
        topics: tuple[str, ...] = (TOPIC_APPROVAL_REQUIRED,),
    ) -> None:
        self._topics = topics
        self._store = store
        self._webhook = webhook
        self._secret = secret
        self._clock = clock
        self._owner = owner
        self._console_url = console_url.rstrip("/")
        self._transport = transport

    def client(self) -> httpx2.AsyncClient:
        """The HTTP client every pass of a running notifier shares (its connections are reused)."""
        return httpx2.AsyncClient(timeout=self._webhook.timeout_s, transport=self._transport)

    async def tick(self, http: httpx2.AsyncClient) -> int:
        """Deliver every due message once; returns how many were delivered."""
        lease_s = self._webhook.timeout_s * 2 + 5
        claimed = await anyio.to_thread.run_sync(
            lambda: self._store.claim_outbox(
                ClaimOutbox(owner=self._owner, now=self._clock(), lease_s=lease_s, topics=self._topics)
            )
        )
        delivered = 0
        for message in claimed:
            delivered += await self.deliver(http, message)
        return delivered

    async def deliver(self, http: httpx2.AsyncClient, message: OutboxMessage) -> bool:
        body = self.body(message)
        timestamp = str(int(self._clock().timestamp()))
        headers = {
            "Content-Type": "application/json",
            DELIVERY_HEADER: message.message_id,
            TIMESTAMP_HEADER: timestamp,
            SIGNATURE_HEADER: sign(self._secret, timestamp, body),
        }
        error: str | None = None
        timeout_s = self._webhook.timeout_s
        try:
            # httpx2's timeout bounds each read, so a receiver sending a byte a second never timed
            # out and held every later notification behind it; the deadline bounds the whole
            # exchange. Only the status matters: the body is never read.
            with anyio.fail_after(timeout_s):
                async with http.stream("POST", self._webhook.url, content=body, headers=headers) as response:
                    status = response.status_code
            if not 200 <= status < 300:
                error = f"http {status}"
        except TimeoutError:
            error = f"no complete answer within {timeout_s:g}s (timeout_s)"
        except httpx2.HTTPError as exc:  # the receiver is down or slow: retried later
            error = f"{type(exc).__name__}: {exc}"[:500]
        now = self._clock()
        if error is None:
            await anyio.to_thread.run_sync(
                lambda: self._store.outbox_delivered(
                    OutboxDelivered(message.message_id, owner=self._owner, now=now)
                )
            )
            return True
        retry_at = (
            now + timedelta(seconds=backoff(self._webhook, message.attempts))
            if message.attempts < self._webhook.max_attempts
            else None
        )
        logger.warning(
            "webhook delivery of %s failed (attempt %d): %s", message.message_id, message.attempts, error
        )
        await anyio.to_thread.run_sync(
            lambda: self._store.outbox_failed(
                OutboxFailed(message.message_id, owner=self._owner, error=error, retry_at=retry_at, now=now)
            )
        )
        return False

    def body(self, message: OutboxMessage) -> bytes:
        payload: dict[str, Any] = dict(message.payload)
        payload.setdefault("type", message.topic)
        payload["messageId"] = message.message_id
        if message.tool_call_id is not None:
            payload["toolCallId"] = message.tool_call_id
        if message.approval_id:
            payload["console"] = f"{self._console_url}/approvals/{message.approval_id}"
        return canonical_json(payload).encode()
