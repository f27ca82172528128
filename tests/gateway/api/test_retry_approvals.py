"""Separation of duties across resolve, retry and approve, over the real gateway in process
(`gateway/mcp/inproc.py`), on both stores.

A person with the approver role may resolve another's unknown call `failed` (which frees its key) and
retry it: retries are how a failed call is sent again. The retry is theirs as a call is its requester's,
so they may not also approve it, at any face that decides (API, CLI, console); someone else does. Without
that, one person sends a second effect under the retry's new key with nobody else involved.
The rules themselves: `gateway/calls/test_approvals.py` and `store/test_approvals.py`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest

from gateway.console.csrf import csrf_token
from gateway.console.routes import SESSION_COOKIE
from tests.e2e.harness import Backend
from tests.eventually import eventually
from tests.gateway.mcp.inproc import Writ, acme, writ
from tests.postgres import fresh_schema

pytestmark = pytest.mark.anyio

ARGS = {"order_id": "1002", "amount": 250, "currency": "EUR", "reason": "damaged in transit"}
"""Over 100: the demo's policy asks an approver."""


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Writ, Backend]]:
    with contextlib.ExitStack() as stack:
        if request.param == "sqlite":
            url = f"sqlite:///{tmp_path / 'writ.db'}"
        else:
            url = stack.enter_context(fresh_schema(request.getfixturevalue("postgres_url")))
        backend = stack.enter_context(acme(tmp_path))
        # No reconciliation worker: the unknown call stays unknown until a person settles it.
        config = {"timeout_s": 0.5, "overrides": {"workers": {"enabled": False}}}
        yield stack.enter_context(writ(tmp_path, backend, url, **config)), backend


def _post(gateway: Writ, path: str, token: str, body: dict[str, Any]) -> httpx2.Response:
    headers = {"Authorization": f"Bearer {token}"}
    return httpx2.post(f"{gateway.url}{path}", json=body, headers=headers, timeout=30)


def _call(gateway: Writ, tool_call_id: str, token: str) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}"}
    body: dict[str, Any] = httpx2.get(
        f"{gateway.url}/api/calls/{tool_call_id}", headers=headers, timeout=10
    ).json()
    return body


@contextmanager
def _console(gateway: Writ, token: str) -> Iterator[httpx2.Client]:
    """A browser signed in at the console with `token`: its session cookie, and the console's origin."""
    headers = {"Origin": gateway.url, "Sec-Fetch-Site": "same-origin"}
    with httpx2.Client(base_url=gateway.url, headers=headers, timeout=10) as console:
        login = console.post("/console/login", data={"token": token})
        assert login.status_code == 303, login.text
        yield console


async def test_resolve_failed_then_retry_is_one_persons_and_the_retrys_approval_anothers(
    served: tuple[Writ, Backend],
) -> None:
    gateway, backend = served
    bob, carol, dan = (gateway.token(name, roles="approver") for name in ("bob", "carol", "dan"))
    backend.chaos(hang=1)  # alice's approved refund is sent and never answered
    async with gateway.client(gateway.token("alice")) as client:
        first = await client.call_tool("refund_order", ARGS, meta={"writ/idempotencyKey": "chain"})
    pending = first.structured_content or {}
    original = pending["toolCallId"]
    granted = _post(gateway, f"/api/approvals/{pending['approvalId']}/decision", dan, {"decision": "approve"})
    assert granted.status_code == 200, granted.text
    await eventually(lambda: _call(gateway, original, bob), lambda c: c["status"] == "result_unknown")

    # bob did not make the call: he may settle it failed, freeing its key, and retry it.
    verdict = {"outcome": "failed", "evidence": "no refund in the bank statement"}
    resolved = _post(gateway, f"/api/calls/{original}/resolution", bob, verdict)
    assert resolved.status_code == 200, resolved.text
    retried = _post(gateway, f"/api/calls/{original}/retry", bob, {"reason": "resend it"})
    assert retried.status_code == 200, retried.text
    retry = retried.json()
    assert (retry["status"], retry["retryOf"], retry["idempotencyKey"]) == (
        "approval_pending",
        original,
        "chain:retry-1",
    )
    approval_id = retry["approvalId"]

    # ... and may not approve his retry: not over the API, the CLI or the console.
    by_api = _post(gateway, f"/api/approvals/{approval_id}/decision", bob, {"decision": "approve"})
    by_cli = gateway.cli("approvals", "approve", approval_id, "--token", bob, check=False)
    with _console(gateway, bob) as console:
        page = console.get(f"/console/approvals/{approval_id}")
        by_console = console.post(
            f"/console/approvals/{approval_id}/decision",
            data={"decision": "approve", "csrf": csrf_token(console.cookies[SESSION_COOKIE])},
        )

    assert (by_api.status_code, by_api.json()["error"]) == (403, "self_approval_forbidden")
    assert "bob asked for this retry" in by_api.json()["error_description"]
    assert by_cli.returncode == 1 and "self_approval_forbidden" in by_cli.stderr
    assert page.status_code == 200 and "You asked for this retry" in page.text
    assert by_console.status_code == 403 and "self_approval_forbidden" in by_console.text
    retry_events = [e.type for e in gateway.runtime.store.events(tool_call_id=retry["toolCallId"])]
    assert "approval.granted" not in retry_events
    assert backend.refunds("chain:retry-1") == []

    # carol, who neither made, resolved nor retried it, approves it: it is sent once.
    by_carol = _post(gateway, f"/api/approvals/{approval_id}/decision", carol, {"decision": "approve"})
    assert by_carol.status_code == 200, by_carol.text
    done = await eventually(
        lambda: _call(gateway, retry["toolCallId"], carol), lambda c: c["status"] == "completed"
    )
    assert done["idempotencyKey"] == "chain:retry-1"
    assert len(backend.refunds("chain:retry-1")) == 1
    verified = gateway.cli("audit", "verify", check=False)
    assert verified.returncode == 0, verified.stdout + verified.stderr
