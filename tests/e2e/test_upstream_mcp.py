"""An upstream MCP server's tools re-exposed through Writ (renamed, guarded, recorded), stdio and HTTP.

The upstream is a process (spawned by the gateway over stdio, or serving HTTP), hence e2e; the gateway is
served in this process (`inproc.served`, one per case on a config of its own), its CLI run by its own
`main`."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from store.keys import scoped_key
from tests.e2e.harness import free_port, stop, wait_listening
from tests.eventually import eventually
from tests.gateway.mcp import inproc

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

UPSTREAM = Path(__file__).with_name("notes_upstream.py")


@contextlib.contextmanager
def upstream_http(notes: Path) -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen([sys.executable, str(UPSTREAM), str(notes), "--http", str(port)])
    try:
        wait_listening(port, process)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        stop(process)


@contextlib.contextmanager
def gateway_for(tmp_path: Path, backend: dict) -> Iterator[inproc.Writ]:
    port = free_port()
    config = {
        "server": {"port": port},
        "store": {"url": f"sqlite:///{tmp_path / 'writ.db'}"},
        "auth": {"dev_issuer": {"enabled": True, "key_file": str(tmp_path / "dev.jwk")}},
        "privacy": {"salt_file": str(tmp_path / "salt")},
        "backends": {"notes": backend},
        "policy": {"rules": [{"id": "agents", "roles": ["agent"], "decision": "allow"}]},
    }
    path = tmp_path / "writ.yaml"
    path.write_text(yaml.safe_dump(config))
    with inproc.served(path, tmp_path) as gateway:
        yield gateway


def notes_backend(transport: str, notes: Path, url: str | None = None) -> dict:
    common = {
        "tools": ["add_note", "list_notes"],
        "rename": {"add_note": "notes_add"},
        # No default effect: list_notes is a read by its readOnlyHint, add_note a write by default.
        "defaults": {"version": "3"},
    }
    if transport == "stdio":
        return {"type": "mcp", "command": [sys.executable, str(UPSTREAM), str(notes)], **common}
    return {"type": "mcp", "url": url, **common}


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_upstream_tools_are_re_exposed_renamed_and_their_effects_happen_once(
    tmp_path: Path, transport: str
) -> None:
    notes = tmp_path / "notes.json"
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(upstream_http(notes)) if transport == "http" else None
        gateway = stack.enter_context(gateway_for(tmp_path, notes_backend(transport, notes, url)))
        async with gateway.client(gateway.token("alice", roles="agent")) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert set(tools) == {"notes_add", "list_notes", "writ_call_status"}
            assert tools["notes_add"].input_schema["required"] == ["text"]  # taken from the upstream
            assert tools["list_notes"].annotations.read_only_hint is True

            added = await client.call_tool("notes_add", {"text": "hello"}, meta={"writ/idempotencyKey": "n1"})
            again = await client.call_tool("notes_add", {"text": "hello"}, meta={"writ/idempotencyKey": "n1"})
            listed = await client.call_tool("list_notes", {})
            bad = await client.call_tool("notes_add", {"text": ""})

    sent = scoped_key("acme", "alice", "n1")  # the upstream gets the key scoped to alice
    assert added.structured_content == {"id": 1, "text": "hello", "key": sent}  # its result, unchanged
    assert json.loads(added.content[0].text) == added.structured_content
    assert again.meta["writ/toolCallId"] == added.meta["writ/toolCallId"]
    assert listed.structured_content["notes"] == [{"id": 1, "text": "hello", "key": sent}]
    assert bad.is_error and bad.structured_content["reason"] == "invalid_arguments"
    assert len(json.loads(notes.read_text())) == 1


def late_notes_backend(notes: Path) -> dict:
    """Notes answered too late (after a 1 s timeout), looked up by key with the upstream's own tool."""
    return {
        "type": "mcp",
        "command": [sys.executable, str(UPSTREAM), str(notes)],
        "env": {"NOTES_ANSWER_DELAY_S": "3"},
        "tools": ["add_note"],
        "overrides": {
            "add_note": {
                "timeout_s": 1,
                "reconcile": {
                    "tool": "find_note_by_key",
                    "arguments": {"key": "{idempotency_key}"},
                    "records": "/notes",  # it answers {"notes": [...]}, each note with its key
                },
            }
        },
    }


async def settled_note(gateway: inproc.Writ, subject: str, text: str, key: str) -> dict:
    """Add a note as `subject` (its answer comes too late), and wait for reconciliation to settle it."""
    async with gateway.client(gateway.token(subject, roles="agent")) as client:
        first = await client.call_tool("add_note", {"text": text}, meta={"writ/idempotencyKey": key})
        assert first.structured_content["status"] == "result_unknown"
        status = await eventually(
            lambda: client.call_tool("writ_call_status", {"toolCallId": first.meta["writ/toolCallId"]}),
            lambda s: s.structured_content["status"] != "result_unknown",
            within_s=30,
        )
    return status.structured_content


async def test_a_lookup_by_key_finds_the_principals_own_note_not_anothers_under_the_same_key(
    tmp_path: Path,
) -> None:
    # The upstream keeps no request id, so a record under a key names no call: only the key says whose
    # it is. Sent as the client gave it, bob's note was found for alice's call and settled it.
    notes = tmp_path / "notes.json"
    with gateway_for(tmp_path, late_notes_backend(notes)) as gateway:
        bobs = await settled_note(gateway, "bob", "bob's", "shared")
        alices = await settled_note(gateway, "alice", "alice's", "shared")

    assert (bobs["status"], alices["status"]) == ("completed", "completed")
    # Each settled with its own note: alice's lookup did not find bob's, added first under "shared".
    assert [n["result"]["structuredContent"]["text"] for n in (bobs, alices)] == ["bob's", "alice's"]
    assert bobs["result"]["structuredContent"] == {
        "id": 1,
        "text": "bob's",
        "key": scoped_key("acme", "bob", "shared"),
    }
    assert alices["result"]["structuredContent"] == {
        "id": 2,
        "text": "alice's",
        "key": scoped_key("acme", "alice", "shared"),
    }
    assert len(json.loads(notes.read_text())) == 2  # looked up, never re-sent


async def test_a_note_whose_answer_came_too_late_is_unknown_then_reconciled_through_the_lookup_tool(
    tmp_path: Path,
) -> None:
    notes = tmp_path / "notes.json"
    backend = late_notes_backend(notes)
    with gateway_for(tmp_path, backend) as gateway:
        async with gateway.client(gateway.token("alice", roles="agent")) as client:
            first = await client.call_tool(
                "add_note", {"text": "late"}, meta={"writ/idempotencyKey": "slow-1"}
            )
            tool_call_id = first.meta["writ/toolCallId"]
            status = await eventually(
                lambda: client.call_tool("writ_call_status", {"toolCallId": tool_call_id}),
                lambda s: s.structured_content["status"] != "result_unknown",
                within_s=30,
            )
        shown = gateway.cli("calls", "show", tool_call_id).stdout
        with gateway.store() as store:
            resolved = store.events(tool_call_id=tool_call_id)[-1]

    assert first.structured_content["status"] == "result_unknown"
    settled = status.structured_content
    assert (settled["status"], settled["verification"]) == ("completed", "confirmed_success")
    sent = scoped_key("acme", "alice", "slow-1")
    assert settled["result"]["structuredContent"] == {"id": 1, "text": "late", "key": sent}
    assert "reconciliation.resolved" in shown
    assert resolved.payload["evidence"]["lookup_tool"] == "find_note_by_key"
    assert len(json.loads(notes.read_text())) == 1  # looked up, never re-sent
