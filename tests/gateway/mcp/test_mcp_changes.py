"""Upstreams that change while Writ runs: a new tool listing is discovered again without a restart,
checked as at startup, and announced to Writ's own clients in either era; a tool whose contract changed
under a pending approval is refused when the approval comes.

One gateway (in-process, `inproc.py`) fronts `shifting_upstream.py` four times: `ch` and `mh` over
streamable HTTP in this process, `cs` and `ms` over stdio as child processes, the first two spoken to
in the 2025-11-25 era, the others in 2026-07-28 (where Writ hears list changes on a listen stream).
"""

from __future__ import annotations

import sys
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
import uvicorn
from mcp import MCPError
from mcp.shared.exceptions import MCPDeprecationWarning

from gateway.mcp.relays import REFUSED, RESOURCE_NOT_FOUND
from tests.e2e.harness import free_port
from tests.eventually import eventually
from tests.gateway.mcp import shifting_upstream
from tests.gateway.mcp.inproc import Backend, Writ, acme, serving, writ
from tests.gateway.mcp.shifting_upstream import shifting_app

pytestmark = pytest.mark.anyio

UPSTREAMS = ["ch", "cs"]
"""Spoken to in the 2025-11-25 era, as `mh` (HTTP) and `ms` (stdio) are in 2026-07-28."""
EVERY = [*UPSTREAMS, "mh", "ms"]


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    with acme(tmp_path_factory.mktemp("acme")) as b:
        yield b


@pytest.fixture(scope="module")
def shifting_url() -> Iterator[str]:
    port = free_port()
    config = uvicorn.Config(shifting_app("ch"), host="127.0.0.1", port=port, log_level="warning")
    with serving(config):
        yield f"http://127.0.0.1:{port}/mcp"


def _upstreams(url: str, modern_url: str) -> dict[str, Any]:
    modern = {"mode": "2026-07-28", "timeout_s": 10}
    return {
        "mh": {"type": "mcp", "url": modern_url, **modern, "resources": {"uri_prefix": "mh+"}},
        "ms": {
            "type": "mcp",
            "command": [sys.executable, shifting_upstream.__file__, "ms"],
            **modern,
            "resources": {"uri_prefix": "ms+"},
        },
        "ch": {
            "type": "mcp",
            "url": url,
            "mode": "legacy",
            "timeout_s": 10,
            "resources": {"uri_prefix": "ch+"},
        },
        "cs": {
            "type": "mcp",
            "command": [sys.executable, shifting_upstream.__file__, "cs"],
            "mode": "legacy",
            "timeout_s": 10,
            "resources": {"uri_prefix": "cs+"},
        },
    }


RULES: list[dict[str, Any]] = [
    {
        "id": "agents-shift",
        "tools": [f"{name}_{tool}" for name in EVERY for tool in ("pay", "reshape", "touch", "extra")],
        "roles": ["agent"],
        "decision": "allow",
    },
    {
        "id": "big-payments-need-approval",
        "tools": [f"{name}_pay" for name in EVERY],
        "when": "double(args.amount) > 100.0",
        "decision": "require_approval",
        "approval": {"approver_role": "approver"},
    },
    {
        "id": "agents-read-notes",
        "resources": [f"{name}+note://*" for name in EVERY],
        "roles": ["agent"],
        "decision": "allow",
    },
]


@pytest.fixture(scope="module")
def modern_url() -> Iterator[str]:
    port = free_port()
    config = uvicorn.Config(shifting_app("mh"), host="127.0.0.1", port=port, log_level="warning")
    with serving(config):
        yield f"http://127.0.0.1:{port}/mcp"


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, backend: Backend, shifting_url: str, modern_url: str
) -> Iterator[Writ]:
    workdir: Path = tmp_path_factory.mktemp("writ")
    store = f"sqlite:///{workdir / 'writ.db'}"
    with writ(
        workdir, backend, store, extra_backends=_upstreams(shifting_url, modern_url), extra_rules=RULES
    ) as g:
        yield g


def _key() -> dict[str, Any]:
    return {"writ/idempotencyKey": uuid.uuid4().hex}


async def _tools(client: Any) -> dict[str, dict[str, Any]]:
    return {tool.name: tool.input_schema for tool in (await client.list_tools()).tools}


@pytest.mark.parametrize("upstream", EVERY)
async def test_a_changed_tool_listing_is_taken_without_a_restart_and_announced_in_either_era(
    gateway: Writ, upstream: str
) -> None:
    heard: list[Any] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            heard.append(message)

    token = gateway.token("ann", roles="agent")
    async with (
        gateway.client(token, mode="legacy", message_handler=on_message) as client,
        gateway.client(token, mode="2026-07-28") as modern,
    ):
        assert client.server_capabilities.tools is not None and client.server_capabilities.tools.list_changed
        await client.call_tool(f"{upstream}_reshape", {"shape": 1}, meta=_key())
        await eventually(lambda: gateway.runtime.registry.get(f"{upstream}_extra") is None)
        before = await _tools(client)
        assert f"{upstream}_extra" not in before
        assert before[f"{upstream}_pay"]["required"] == ["amount"]
        heard.clear()
        async with modern.listen(tools_list_changed=True) as subscription:
            await client.call_tool(f"{upstream}_reshape", {"shape": 2}, meta=_key())
            with anyio.fail_after(10):
                async for event in subscription:
                    assert type(event).__name__ == "ToolsListChanged"
                    break
        # Taken (the registry has the new tool), then announced: waiting on the announcement alone could
        # be satisfied by a late one of the shape-1 reshape above.
        await eventually(lambda: gateway.runtime.registry.get(f"{upstream}_extra") is not None)
        await eventually(lambda: len(heard), lambda n: n >= 1)
        after = await _tools(client)
        assert after[f"{upstream}_pay"]["required"] == ["amount", "currency"]
        extra = await client.call_tool(f"{upstream}_extra", {}, meta=_key())
        refused = await client.call_tool(f"{upstream}_pay", {"amount": 5}, meta=_key())
        paid = await client.call_tool(f"{upstream}_pay", {"amount": 5, "currency": "EUR"}, meta=_key())
        await client.call_tool(f"{upstream}_reshape", {"shape": 1}, meta=_key())
    assert [c.text for c in extra.content if isinstance(c, types.TextContent)] == ["extra"]
    # The new schema is the one checked: Writ refuses the old form before the upstream sees it.
    assert refused.is_error and (refused.structured_content or {}).get("reason") == "invalid_arguments"
    assert [c.text for c in paid.content if isinstance(c, types.TextContent)] == ["paid 5 EUR"]


@pytest.mark.parametrize("upstream", EVERY)
async def test_a_call_approved_for_a_tool_whose_schema_changed_meanwhile_is_refused(
    gateway: Writ, upstream: str
) -> None:
    token = gateway.token("ann", roles="agent")
    async with gateway.client(token, mode="legacy") as client:
        await client.call_tool(f"{upstream}_reshape", {"shape": 1}, meta=_key())
        await eventually(lambda: gateway.runtime.registry.get(f"{upstream}_extra") is None)
        held = await client.call_tool(f"{upstream}_pay", {"amount": 500}, meta=_key())
        pending = held.structured_content or {}
        assert pending["status"] == "approval_pending"
        await client.call_tool(f"{upstream}_reshape", {"shape": 2}, meta=_key())
        await eventually(lambda: gateway.runtime.registry.get(f"{upstream}_extra") is not None)
        decided = httpx2.post(
            f"{gateway.url}/api/approvals/{pending['approvalId']}/decision",
            json={"decision": "approve"},
            headers={"Authorization": f"Bearer {gateway.token('boss', roles='approver')}"},
            timeout=10,
        )
        assert decided.status_code == 200, decided.text

        async def status() -> dict[str, Any]:
            answer = await client.call_tool("writ_call_status", {"toolCallId": pending["toolCallId"]})
            return answer.structured_content or {}

        done = await eventually(status, lambda s: s.get("status") not in ("approval_pending", "approved"))
        await client.call_tool(f"{upstream}_reshape", {"shape": 1}, meta=_key())
    assert (done["status"], done.get("reason")) == ("denied", "capability_changed")


def _texts(result: types.CallToolResult) -> list[str]:
    return [c.text for c in result.content if isinstance(c, types.TextContent)]


@pytest.mark.parametrize("upstream", UPSTREAMS)
async def test_a_subscribed_session_hears_of_updates_until_it_unsubscribes(
    gateway: Writ, upstream: str
) -> None:
    heard: list[str] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            heard.append(str(message.params.uri))

    uri = f"{upstream}+note://{upstream}"
    token = gateway.token("ann", roles="agent")
    async with gateway.client(token, mode="legacy", message_handler=on_message) as client:
        assert client.server_capabilities.resources is not None
        assert client.server_capabilities.resources.subscribe
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            await client.subscribe_resource(uri)
            await client.subscribe_resource(uri)  # once is enough: Writ subscribes upstream once
            touched = await client.call_tool(f"{upstream}_touch", {}, meta=_key())
            await eventually(lambda: heard, lambda h: h == [uri])
            await client.unsubscribe_resource(uri)
            after = await client.call_tool(f"{upstream}_touch", {}, meta=_key())
    assert _texts(touched) == [f"touched note://{upstream} for 1"]
    assert _texts(after) == [f"touched note://{upstream} for 0"]  # Writ unsubscribed upstream too
    assert heard == [uri]


async def test_a_subscription_policy_would_not_let_the_caller_read_is_refused(gateway: Writ) -> None:
    token = gateway.token("rea", roles="reader")
    async with gateway.client(token, mode="legacy") as client:
        with warnings.catch_warnings(), pytest.raises(MCPError) as refused:
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            await client.subscribe_resource("ch+note://ch")
        with warnings.catch_warnings(), pytest.raises(MCPError) as unknown:
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            await client.subscribe_resource("nowhere://x")
    assert (refused.value.code, refused.value.data["reason"]) == (REFUSED, "no_matching_rule")
    assert unknown.value.code == RESOURCE_NOT_FOUND


@pytest.mark.parametrize("upstream", UPSTREAMS)
async def test_a_2026_listen_stream_hears_of_updates_of_the_uris_it_may_read(
    gateway: Writ, upstream: str
) -> None:
    uri = f"{upstream}+note://{upstream}"
    async with (
        gateway.client(gateway.token("ann", roles="agent"), mode="2026-07-28") as client,
        client.listen(resource_subscriptions=[uri, "nowhere://x"]) as subscription,
    ):
        assert list(subscription.honored.resource_subscriptions or []) == [uri]
        touched = await client.call_tool(f"{upstream}_touch", {}, meta=_key())
        with anyio.fail_after(10):
            async for event in subscription:
                assert getattr(event, "uri", None) == uri
                break
    assert _texts(touched) == [f"touched note://{upstream} for 1"]


@pytest.mark.parametrize("upstream", ["mh", "ms"])
@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_updates_from_a_2026_upstream_reach_the_clients_watching_in_either_era(
    gateway: Writ, upstream: str, mode: str
) -> None:
    """A 2026-07-28 upstream has no resources/subscribe: Writ opens its listen stream again with the
    URIs its clients watch, and passes each update on as it does a 2025-11-25 upstream's."""
    uri = f"{upstream}+note://{upstream}"
    token = gateway.token("ann", roles="agent")
    if mode == "2026-07-28":
        async with (
            gateway.client(token, mode=mode) as client,
            client.listen(resource_subscriptions=[uri]) as subscription,
        ):
            assert list(subscription.honored.resource_subscriptions or []) == [uri]

            async def touch_until_heard() -> Any:
                # The upstream's stream is opened again with the new filter just after the ack.
                async with anyio.create_task_group() as group:

                    async def touching() -> None:
                        while True:
                            await client.call_tool(f"{upstream}_touch", {}, meta=_key())
                            await anyio.sleep(0.2)

                    group.start_soon(touching)
                    async for event in subscription:
                        group.cancel_scope.cancel()
                        return event

            with anyio.fail_after(10):
                event = await touch_until_heard()
        assert getattr(event, "uri", None) == uri
        return
    heard: list[str] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            heard.append(str(message.params.uri))

    async with gateway.client(token, mode=mode, message_handler=on_message) as client:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            await client.subscribe_resource(uri)

            async def touched() -> list[str]:
                await client.call_tool(f"{upstream}_touch", {}, meta=_key())
                return heard

            def got_it(seen: list[str]) -> bool:
                return uri in seen

            await eventually(touched, got_it)
            await client.unsubscribe_resource(uri)
    assert set(heard) == {uri}
