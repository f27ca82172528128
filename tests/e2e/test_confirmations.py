"""Confirm-class capabilities ask the user in the client (input-required, 2026-07-28).

Against the whole gateway served in this process (one for the module; two `inproc.writ` on one store for
the replica cases); the restart cases restart `writ serve` processes, and a bad key file stops `writ
serve` at start-up (e2e: what only processes show).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from string import Template
from typing import Any

import httpx2
import mcp_types as types
import pytest
import yaml
from mcp.shared.exceptions import MCPError

from gateway.audit.security import SecurityEvents
from store import EventFilter
from tests.e2e.harness import REPO, Backend, Gateway, demo_config, free_port, writ, writ_gateway
from tests.eventually import eventually
from tests.gateway.mcp import inproc

pytestmark = pytest.mark.anyio

MODERN = "2026-07-28"


def confirm_overrides() -> dict[str, Any]:
    """The demo's capabilities and policy plus `refund_now`, a refund of class `confirm` for agents."""
    text = Template((REPO / "demo" / "demo.yaml").read_text())
    demo = yaml.safe_load(text.safe_substitute(gateway_port=0, backend_port=0, state_dir="."))
    refund = next(c for c in demo["capabilities"] if c["tool"] == "refund_order")
    refund_now = {
        **refund,
        "id": "refund-now",
        "version": "1",
        "tool": "refund_now",
        "effect": "confirm",
        "description": "Refund an order at once, after the user confirms it.",
    }
    rule = {"id": "agents-refund-now", "tools": ["refund_now"], "roles": ["agent"], "decision": "allow"}
    return {
        "capabilities": [*demo["capabilities"], refund_now],
        "policy": {**demo["policy"], "rules": [*demo["policy"]["rules"], rule]},
    }


def replica_settings(root: Path, key_file: Path | None) -> dict[str, Any]:
    """What replicas behind one URL share: the public URL, the issuer's key and, maybe, the sealing keys."""
    overrides = confirm_overrides()
    if key_file is not None:
        overrides["confirmations"] = {"key_file": str(key_file)}
    return {
        "server": {"public_url": "http://writ.example"},
        "auth": {
            "dev_issuer": {"enabled": True, "key_file": str(root / "shared-dev-issuer.jwk")},
            # Writ's authorization server needs https (or loopback) for its public URL.
            "authorization_server": {"enabled": False},
        },
        "overrides": overrides,
    }


# One backend for the module, and one gateway with `refund_now` for the cases that need no restart or
# replica of their own, both in this process: every case sends its own keys and compares the refunds
# with what was before. The gateways a restart or a replica case starts call the same backend.
@pytest.fixture
def backend(inproc_sqlite_backend: Backend) -> Backend:
    return inproc_sqlite_backend


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, inproc_sqlite_backend: Backend) -> Iterator[Gateway]:
    workdir = tmp_path_factory.mktemp("writ")
    with inproc.writ(
        workdir, inproc_sqlite_backend, f"sqlite:///{workdir / 'writ.db'}", overrides=confirm_overrides()
    ) as g:
        yield g


def args(order: str = "1001", amount: float = 5) -> dict[str, Any]:
    return {"order_id": order, "amount": amount, "currency": "EUR", "reason": "late delivery"}


class User:
    """An elicitation callback that answers every confirmation with `action` and remembers the asks."""

    def __init__(self, action: str) -> None:
        self.action = action
        self.asked: list[types.ElicitRequestFormParams] = []

    async def __call__(self, context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        assert isinstance(params, types.ElicitRequestFormParams)
        self.asked.append(params)
        return types.ElicitResult(action=self.action, content={} if self.action == "accept" else None)  # type: ignore[arg-type]


def events(gateway: Gateway, tool_call_id: str) -> list[str]:
    # Through the call, not its run: a 2026-07-28 client that names none is in no run.
    headers = {"Authorization": f"Bearer {gateway.token('auditor', roles='admin')}"}
    call = httpx2.get(f"{gateway.url}/api/calls/{tool_call_id}", headers=headers, timeout=10).json()
    assert call["runId"] is None
    return gateway.event_types(tool_call_id)


async def test_the_user_confirms_in_the_client_and_the_call_runs_once(
    gateway: Gateway, backend: Backend
) -> None:
    user = User("accept")
    async with gateway.client(gateway.token("alice"), mode=MODERN, elicitation_callback=user) as client:
        result = await client.call_tool("refund_now", args(), meta={"writ/idempotencyKey": "now-1"})

    assert result.meta is not None and result.meta["writ/status"] == "completed", result
    assert [a.message for a in user.asked] == [
        "Confirm this action: refund 5 EUR to order 1001 (refund-now@1), requested by alice. "
        "Accept to run it once; decline to cancel it."
    ]
    assert len(backend.refunds("now-1")) == 1
    assert events(gateway, result.meta["writ/toolCallId"])[-4:] == [
        "confirmation.required",
        "confirmation.given",
        "tool_call.dispatching",
        "tool_call.completed",
    ]


@pytest.mark.parametrize(("action", "reason"), [("decline", "user_declined"), ("cancel", "user_cancelled")])
async def test_the_user_declines_and_nothing_is_sent(
    gateway: Gateway, backend: Backend, action: str, reason: str
) -> None:
    async with gateway.client(
        gateway.token("alice"), mode=MODERN, elicitation_callback=User(action)
    ) as client:
        result = await client.call_tool("refund_now", args(), meta={"writ/idempotencyKey": f"now-2-{action}"})

    assert (result.structured_content["status"], result.structured_content["reason"]) == ("denied", reason)
    assert backend.refunds(f"now-2-{action}") == []


async def first_round(client: Any, key: str) -> types.InputRequiredResult:
    first = await client.session.call_tool(
        "refund_now", args(), meta={"writ/idempotencyKey": key}, allow_input_required=True
    )
    assert isinstance(first, types.InputRequiredResult), first
    return first


ACCEPT = {"writ/confirm": types.ElicitResult(action="accept", content={})}


async def accept(client: Any, first: types.InputRequiredResult, key: str, **arguments: Any) -> Any:
    """The client's retry carrying the user's acceptance of the round `first` began."""
    return await client.session.call_tool(
        "refund_now",
        args(**arguments),
        meta={"writ/idempotencyKey": key},
        input_responses=ACCEPT,
        request_state=first.request_state,
        allow_input_required=True,
    )


async def test_a_replayed_confirmation_is_refused_and_runs_nothing_again(
    gateway: Gateway, backend: Backend
) -> None:
    async with gateway.client(
        gateway.token("alice"), mode=MODERN, elicitation_callback=User("accept")
    ) as client:
        first = await first_round(client, "now-3")
        assert first.input_requests is not None and list(first.input_requests) == ["writ/confirm"]

        async def answer() -> Any:
            return await accept(client, first, "now-3")

        done = await answer()
        assert done.meta["writ/status"] == "completed"
        replay = await answer()

    assert replay.is_error and replay.structured_content["reason"] == "confirmation_used"
    assert len(backend.refunds("now-3")) == 1


async def test_a_confirmation_for_other_arguments_is_refused_by_the_state_binding(
    gateway: Gateway, backend: Backend
) -> None:
    before = backend.refunds()
    async with gateway.client(
        gateway.token("alice"), mode=MODERN, elicitation_callback=User("accept")
    ) as client:
        first = await first_round(client, "now-4")
        with pytest.raises(MCPError, match="Invalid or expired requestState"):
            await accept(client, first, "now-4", amount=9000)
    assert backend.refunds("now-4") == []
    assert backend.refunds() == before


@pytest.mark.e2e
async def test_a_confirmation_from_before_a_restart_is_refused_and_runs_nothing(
    tmp_path: Path, backend: Backend
) -> None:
    store_url = f"sqlite:///{tmp_path / 'writ.db'}"
    settings = replica_settings(tmp_path, None)  # same URL and issuer: only the sealing key is new
    with writ_gateway(tmp_path, backend, store_url, **settings) as before:
        async with before.client(
            before.token("alice"), mode=MODERN, elicitation_callback=User("accept")
        ) as client:
            first = await first_round(client, "now-5")
            tool_call_id = (first.meta or {})["writ/toolCallId"]

    with writ_gateway(tmp_path, backend, store_url, **settings) as after:
        async with after.client(
            after.token("alice"), mode=MODERN, elicitation_callback=User("accept")
        ) as client:
            with pytest.raises(MCPError, match="Invalid or expired requestState"):
                await accept(client, first, "now-5")
            status = await client.call_tool("writ_call_status", {"toolCallId": tool_call_id})
        assert status.structured_content["status"] == "awaiting_confirmation"
        assert "confirmation.given" not in events(after, tool_call_id)
    assert backend.refunds("now-5") == []


async def test_a_client_that_cannot_be_asked_is_refused_and_nothing_is_sent(
    gateway: Gateway, backend: Backend
) -> None:
    before = backend.refunds()
    for mode, callback in (("legacy", User("accept")), (MODERN, None)):
        async with gateway.client(gateway.token("alice"), mode=mode, elicitation_callback=callback) as client:
            result = await client.call_tool("refund_now", args(), meta={"writ/idempotencyKey": f"now-{mode}"})
        assert result.structured_content["reason"] == "confirmation_unavailable", (mode, result)
    assert backend.refunds() == before


async def answer_elsewhere(
    begin_at: Gateway, answer_at: Gateway, key: str
) -> tuple[types.InputRequiredResult, Any]:
    """Begin a confirmation round at one replica and send the user's answer to another.

    Returns the first round and the answer's result, or the `MCPError` it was refused with.
    """
    token, user = begin_at.token("alice"), User("accept")
    async with begin_at.client(token, mode=MODERN, elicitation_callback=user) as client:
        first = await first_round(client, key)
    async with answer_at.client(token, mode=MODERN, elicitation_callback=user) as client:
        try:
            answered = await accept(client, first, key)
        except MCPError as refused:
            return first, refused
    return first, answered


@pytest.mark.postgres
@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
async def test_replicas_sharing_a_key_file_take_a_confirmation_begun_at_another(
    tmp_path: Path, backend: Backend, store_url: str
) -> None:
    key_file = tmp_path / "confirm.key"
    key_file.write_text("k" * 40 + "\n")
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    settings = replica_settings(tmp_path, key_file)
    with (
        inproc.writ(tmp_path / "a", backend, store_url, **settings) as a,
        inproc.writ(tmp_path / "b", backend, store_url, **settings) as b,
    ):
        first, answered = await answer_elsewhere(a, b, "now-replicas")
        assert answered.meta["writ/status"] == "completed", answered
        tool_call_id = (first.meta or {})["writ/toolCallId"]
        assert events(b, tool_call_id).count("confirmation.given") == 1
    assert len(backend.refunds("now-replicas")) == 1


@pytest.mark.postgres
@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
async def test_replicas_without_a_shared_key_refuse_a_confirmation_begun_at_another(
    tmp_path: Path, backend: Backend, store_url: str
) -> None:
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    settings = replica_settings(tmp_path, None)
    with (
        inproc.writ(tmp_path / "a", backend, store_url, **settings) as a,
        inproc.writ(tmp_path / "b", backend, store_url, **settings) as b,
    ):
        first, refused = await answer_elsewhere(a, b, "now-own-keys")
        assert isinstance(refused, MCPError) and refused.message == "Invalid or expired requestState"
        status = await _status(b, (first.meta or {})["writ/toolCallId"])
    assert status == "awaiting_confirmation"
    assert backend.refunds("now-own-keys") == []


async def _status(gateway: Gateway, tool_call_id: str) -> str:
    async with gateway.client(gateway.token("alice"), mode=MODERN) as client:
        status = await client.call_tool("writ_call_status", {"toolCallId": tool_call_id})
    return str(status.structured_content["status"])


@pytest.mark.e2e
async def test_a_confirmation_from_before_a_restart_is_taken_when_the_key_file_stays(
    tmp_path: Path, backend: Backend
) -> None:
    key_file = tmp_path / "confirm.key"
    key_file.write_text("n" * 48 + "\n" + "o" * 48 + "\n")
    store_url = f"sqlite:///{tmp_path / 'writ.db'}"
    settings = replica_settings(tmp_path, key_file)  # the same URL and issuer before and after
    with writ_gateway(tmp_path, backend, store_url, **settings) as before:
        token = before.token("alice")
        async with before.client(token, mode=MODERN, elicitation_callback=User("accept")) as client:
            first = await first_round(client, "now-6")

    key_file.write_text("r" * 48 + "\n" + "n" * 48 + "\n")  # rotated: a new first key, the old one kept
    with writ_gateway(tmp_path, backend, store_url, **settings) as after:
        async with after.client(token, mode=MODERN, elicitation_callback=User("accept")) as client:
            answered = await accept(client, first, "now-6")
    assert answered.meta["writ/status"] == "completed", answered
    assert len(backend.refunds("now-6")) == 1


@pytest.mark.e2e
def test_a_key_file_with_a_short_key_stops_writ_serve_with_a_clear_error(
    tmp_path: Path, backend: Backend
) -> None:
    key_file = tmp_path / "confirm.key"
    key_file.write_text("s" * 48 + "\n\nshort-secret\n")
    overrides = {**confirm_overrides(), "confirmations": {"key_file": str(key_file)}}
    config = demo_config(
        tmp_path,
        gateway_port=free_port(),
        backend_url=backend.url,
        store_url=f"sqlite:///{tmp_path / 'writ.db'}",
        overrides=overrides,
    )

    failed = writ("serve", "-c", str(config), cwd=tmp_path, check=False)

    assert failed.returncode != 0
    assert f"line 3 of {key_file} has 12 bytes" in failed.stderr
    assert "short-secret" not in failed.stderr + failed.stdout


async def test_an_answer_for_a_tool_gone_since_its_round_is_an_unknown_tool_event(
    gateway: inproc.Writ, backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The state binds the tool name, so an answer names the tool its round began with; the tool can
    # still be gone by then (an upstream MCP server dropped it): as here, taken out of the registry.
    async with gateway.client(
        gateway.token("mallet"), mode=MODERN, elicitation_callback=User("accept")
    ) as client:
        first = await first_round(client, "now-gone")
        monkeypatch.delitem(gateway.runtime.registry._by_tool, "refund_now")
        with pytest.raises(MCPError) as unknown:
            await accept(client, first, "now-gone")
    security = gateway.runtime.security
    assert isinstance(security, SecurityEvents)
    await security.tick(flush_all=True)

    assert unknown.value.code == types.INVALID_PARAMS
    assert backend.refunds("now-gone") == []

    def noted() -> list[dict[str, Any]]:
        found = gateway.runtime.store.export(EventFilter(types=("security.unknown_tool",)))
        return [e for e in found if e["payload"]["subject"] == "mallet"]

    (event,) = await eventually(noted)  # the gateway's own pass may be writing it still
    assert (event["payload"]["kind"], event["payload"]["tool_name"]) == ("unknown_tool", "refund_now")
