"""`writ stdio` as a process relays an upstream's resources and prompts, decided by policy and recorded.

The HTTP face is tested in-process (tests/gateway/mcp/test_mcp_relays.py); this is the stdio face, a
`writ stdio` process whose own upstream is a stdio child of it (tests/gateway/mcp/library_upstream.py).
"""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path

import anyio
import mcp_types as types
import pytest
from mcp import Client, MCPError, StdioServerParameters

from gateway.app import build_runtime
from gateway.config import load_config
from gateway.mcp.relays import REFUSED
from tests.e2e.harness import WRIT, demo_config, free_port
from tests.gateway.mcp import library_upstream

pytestmark = pytest.mark.e2e


def test_writ_stdio_relays_resources_and_prompts_it_may_and_records_each_read(tmp_path: Path) -> None:
    upstream = {
        "type": "mcp",
        "command": [sys.executable, library_upstream.__file__, "box"],
        "resources": True,
        "prompts": True,
    }
    rules = [
        {"id": "read-welcome", "resources": ["note://welcome"], "roles": ["agent"], "decision": "allow"},
        {"id": "summaries", "prompts": ["summarize"], "roles": ["agent"], "decision": "allow"},
    ]
    path = demo_config(
        tmp_path,
        gateway_port=free_port(),
        backend_url=f"http://127.0.0.1:{free_port()}",  # never called: no tool is
        store_url=f"sqlite:///{tmp_path / 'writ.db'}",
        extra_backends={"box": upstream},
        extra_rules=rules,
    )
    issuer = build_runtime(load_config(path)).dev_issuer
    assert issuer is not None
    token = issuer.mint(subject="stella", audience=load_config(path).server.resource_url, roles=["agent"])
    params = StdioServerParameters(
        command=WRIT[0],
        args=["stdio", "-c", str(path)],
        env={**os.environ, "WRIT_TOKEN": token},
        cwd=str(tmp_path),
    )

    async def session() -> tuple[list[str], str, str, MCPError]:
        async with Client(params, mode="2026-07-28") as client:
            listed = [r.uri for r in (await client.list_resources()).resources]
            read = await client.read_resource("note://welcome")
            prompt = await client.get_prompt("summarize", {"topic": "figs"})
            with pytest.raises(MCPError) as denied:
                await client.read_resource("note://secret")
        text = read.contents[0]
        message = prompt.messages[0].content
        assert isinstance(text, types.TextResourceContents) and isinstance(message, types.TextContent)
        return listed, text.text, message.text, denied.value

    listed, text, said, denied = anyio.run(session)
    assert listed == ["note://welcome"]
    assert text == "Welcome to the box library."
    assert said == "[box] Summarize figs in a plain style."
    assert (denied.code, denied.data["reason"]) == (REFUSED, "no_matching_rule")
    with sqlite3.connect(tmp_path / "writ.db") as db:
        rows = db.execute(
            "SELECT tool_name, capability_id, status, subject FROM tool_calls ORDER BY created_at"
        )
        recorded = rows.fetchall()
    assert recorded == [
        ("resources/read", "box/resources", "completed", "stella"),
        ("summarize", "box/prompts/summarize", "completed", "stella"),
        ("resources/read", "box/resources", "denied", "stella"),
    ]
