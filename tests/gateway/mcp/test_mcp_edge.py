"""The MCP face in memory: what a client hears when something inside Writ fails unexpectedly."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from capabilities.config import McpBackend
from capabilities.fake import FakeExecutor, completed, failed, fake_capability
from capabilities.mcp_relays import resource_capability
from capabilities.mcp_upstream import McpExecutor
from capabilities.registry import Registry
from gateway.calls.pipeline import CallInput, CallPipeline
from gateway.mcp.documents import output_schema
from policy.engine import Policy
from policy.model import Principal
from store.store import Store
from tests.gateway.mcp.faces import face

pytestmark = pytest.mark.anyio

ALICE = Principal("alice", tenant="acme", roles=frozenset({"agent"}))


class BrokenPipeline(CallPipeline):
    async def call(self, inp: CallInput):  # type: ignore[override]
        raise RuntimeError("secret detail: postgresql://writ:hunter2@db/writ")


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_an_unexpected_error_is_an_internal_error_that_names_no_detail(
    tmp_path: Path, mode: str
) -> None:
    # A 2025-11-25 session got the exception's own text back (error code 0) from the SDK.
    store = Store.open(f"sqlite:///{tmp_path / 'writ.db'}")
    store.migrate()
    registry = Registry(
        {"fake": FakeExecutor(default=completed({"ok": True}))}, [fake_capability("refund_order")]
    )
    policy = Policy.from_mapping({"rules": [{"id": "all", "roles": ["agent"], "decision": "allow"}]})
    server = face(store, registry, policy, ALICE, pipeline=BrokenPipeline)
    try:
        async with Client(server, mode=mode) as client:
            with pytest.raises(MCPError) as raised:
                await client.call_tool("refund_order", {"order_id": "1"})
            assert (await client.call_tool("writ_call_status", {"toolCallId": "tc_x"})).is_error
    finally:
        store.close()
    assert raised.value.error.code == -32603
    assert "hunter2" not in str(raised.value) and "secret" not in str(raised.value)


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_writ_call_status_publishes_an_output_schema_its_results_validate_against(
    tmp_path: Path, mode: str
) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'writ.db'}")
    store.migrate()
    registry = Registry(
        {"fake": FakeExecutor(default=completed({"ok": True}))},
        [fake_capability("refund_order"), fake_capability("lookup_order")],
    )
    policy = Policy.from_mapping(
        {
            "rules": [
                {"id": "reads", "tools": ["lookup_order"], "roles": ["agent"], "decision": "allow"},
                {
                    "id": "refunds",
                    "tools": ["refund_order"],
                    "roles": ["agent"],
                    "decision": "require_approval",
                    "approval": {"approver_role": "approver", "expires_in": "1h"},
                },
            ]
        }
    )
    server = face(store, registry, policy, ALICE)
    schema = output_schema()
    try:
        async with Client(server, mode=mode) as client:
            listed = {tool.name: tool for tool in (await client.list_tools()).tools}
            assert listed["writ_call_status"].output_schema == schema
            pending = await client.call_tool("refund_order", {"order_id": "1"})
            done = await client.call_tool("lookup_order", {"order_id": "1"})
            told = []
            for call_id in (
                pending.structured_content["toolCallId"],  # type: ignore[index]
                done.meta["writ/toolCallId"],  # type: ignore[index]
            ):
                # The client validates a result against the tool's outputSchema, and refuses one
                # that does not conform; the check below says so without relying on it.
                status = await client.call_tool("writ_call_status", {"toolCallId": call_id})
                assert not status.is_error
                jsonschema.validate(status.structured_content, schema)
                told.append(status.structured_content)
            missing = await client.call_tool("writ_call_status", {"toolCallId": "tc_nobody"})
            jsonschema.validate(missing.structured_content, schema)
    finally:
        store.close()
    assert [t["status"] for t in told] == ["approval_pending", "completed"]  # type: ignore[index]
    assert told[1]["result"]["structuredContent"] == {"ok": True}  # type: ignore[index]
    assert missing.structured_content == {"status": "not_found", "toolCallId": "tc_nobody"}


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_an_unexpected_error_in_a_relayed_read_or_get_names_no_detail(
    tmp_path: Path, mode: str
) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'writ.db'}")
    store.migrate()
    upstream = McpBackend.model_validate({"type": "mcp", "url": "http://127.0.0.1:9/mcp", "resources": True})
    registry = Registry({"lib": McpExecutor("lib", upstream)}, [resource_capability("lib", upstream)])
    registry.relays_resources = True
    policy = Policy.from_mapping({"rules": [{"id": "all", "resources": ["*"], "decision": "allow"}]})
    server = face(store, registry, policy, ALICE, pipeline=BrokenPipeline, relays=True)
    try:
        async with Client(server, mode=mode) as client:
            with pytest.raises(MCPError) as raised:
                await client.read_resource("note://x")
    finally:
        store.close()
    assert raised.value.error.code == -32603
    assert "hunter2" not in str(raised.value) and "secret" not in str(raised.value)


@pytest.mark.parametrize(
    ("error", "told"),
    [
        ("backend_unreachable", "could not be reached (it may be down), so the request was never delivered"),
        ("http_422", "The backend answered with an error."),
    ],
)
async def test_a_failed_write_says_the_backend_answered_only_when_it_did(
    tmp_path: Path, error: str, told: str
) -> None:
    # Connection refused: Writ knows nothing was delivered, and said "The backend answered with an error."
    store = Store.open(f"sqlite:///{tmp_path / 'writ.db'}")
    store.migrate()
    detail = "acme: ConnectError: All connection attempts failed" if error == "backend_unreachable" else "no"
    registry = Registry(
        {"fake": FakeExecutor(default=failed(error, detail))}, [fake_capability("refund_order")]
    )
    policy = Policy.from_mapping({"rules": [{"id": "all", "roles": ["agent"], "decision": "allow"}]})
    try:
        async with Client(face(store, registry, policy, ALICE)) as client:
            result = await client.call_tool("refund_order", {"order_id": "1"})
    finally:
        store.close()
    assert result.is_error
    assert result.structured_content["error"] == error
    assert told in result.structured_content["next"]
    assert result.content[0].text == detail
