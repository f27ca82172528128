"""Webhook signing and retry timing, the parts of delivery a receiver and an operator rely on."""

from __future__ import annotations

from gateway.approvals import WebhookConfig
from gateway.outbox import backoff, sign, verify


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
