"""The MCP executor against real upstream servers: streamable HTTP (in a thread) and stdio (a subprocess)."""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio
import mcp_types
import pytest

from bench.processes import free_port
from capabilities.config import McpBackend, parse_config
from capabilities.contract import BackendUnavailable, CapabilityError, ConfigError, Outcome
from capabilities.mcp_tools import capabilities_from_tools
from capabilities.registry import Registry
from tests.capabilities.conftest import invocation
from tests.capabilities.servers import TOKEN, ServerState, mcp_upstream_server, serve

pytestmark = pytest.mark.anyio

STDIO_SCRIPT = Path(__file__).with_name("stdio_upstream.py")


def files_backend(url: str, **settings: Any) -> dict[str, Any]:
    return {
        "type": "mcp",
        "url": url,
        "auth": {"type": "bearer", "token_env": "FILES_TOKEN"},
        "timeout_s": 5,
        **settings,
    }


def build(backend: dict[str, Any], **environ: str) -> Registry:
    return Registry.from_config(
        parse_config({"files": backend}, []), environ={"FILES_TOKEN": TOKEN, **environ}
    )


@pytest.fixture
async def files(upstream_url: str) -> AsyncIterator[Registry]:
    backend = files_backend(
        upstream_url,
        tools=["read_file", "write_file", "fail", "slow", "hang", "boom"],
        rename={"write_file": "fs_write"},
        defaults={"effect": "write", "version": "3"},
        overrides={
            "hang": {"timeout_s": 0.5},
            "slow": {"effect": "read"},
            "boom": {"effect": "irreversible"},
        },
    )
    async with build(backend) as registry:
        yield registry


async def call(
    registry: Registry, tool: str, arguments: dict[str, Any] | None = None, **fields: Any
) -> Outcome:
    cap = registry.get(tool)
    assert cap is not None, tool
    return await registry.executor(cap).execute(invocation(cap, arguments, **fields))


async def test_an_upstream_echoing_its_credential_encoded_puts_it_into_no_result(upstream_url: str) -> None:
    # The result is recorded and returned as the upstream sent it: only scrubbing stands in between.
    token = "up/stream+token=0123456789abcdef"
    async with build(files_backend(upstream_url, tools=["read_file"]), FILES_TOKEN=token) as registry:
        outcome = await call(registry, "read_file", {"path": "a.txt", "echo": "credential"})

    assert outcome.kind == "completed" and outcome.result is not None
    shown = repr(outcome)
    for form in (
        token,
        token.replace("/", "\\/"),
        quote(token, safe=""),
        base64.b64encode(f"writ:{token}".encode()).decode()[8:-4],
    ):
        assert form not in shown, form
    assert outcome.result.structured == {"echoed": {"escaped": "***", "url": "***", "b64": "d3JpdDp***g=="}}


async def test_discovery_exposes_the_subset_renamed_with_upstream_schemas_and_descriptions(
    files: Registry,
) -> None:
    tools = {cap.tool_name: cap for cap in files.capabilities()}

    assert list(tools) == ["read_file", "fs_write", "fail", "slow", "hang", "boom"]
    assert "admin_reset" not in tools
    read = tools["read_file"]
    assert read.id == "files.read_file"
    assert read.ref == "files.read_file@3"
    assert read.description == "Read a file."
    assert read.input_schema["required"] == ["path"]
    assert tools["fs_write"].id == "files.write_file"


async def test_effects_come_from_overrides_then_defaults_then_read_only_hints(
    files: Registry, upstream_url: str
) -> None:
    effects = {cap.tool_name: cap.effect for cap in files.capabilities()}

    # The operator's default holds against the upstream's hint: read_file says readOnlyHint, and a
    # hint may not make a tool the operator declared a write into a read, which runs before its intent
    # is recorded.
    assert effects["read_file"] == "write"
    assert effects["fs_write"] == "write"  # defaults
    assert effects["slow"] == "read"  # override
    assert effects["boom"] == "irreversible"
    assert files.get("hang") is not None and files.get("hang").timeout_s == 0.5  # type: ignore[union-attr]
    # Where the operator said nothing, the hint decides; with no hint, a tool is a write.
    async with build(files_backend(upstream_url, tools=["read_file", "write_file"])) as hinted:
        assert {cap.tool_name: cap.effect for cap in hinted.capabilities()} == {
            "read_file": "read",
            "write_file": "write",
        }


async def test_a_call_returns_the_upstream_content_and_structured_result_with_key_and_deadline_in_meta(
    files: Registry, upstream_state: ServerState
) -> None:
    deadline = datetime(2026, 12, 1, 15, 40, tzinfo=UTC)
    outcome = await call(
        files, "fs_write", {"path": "a.txt"}, idempotency_key="k-42", commit_deadline=deadline
    )

    assert outcome.kind == "completed"
    assert outcome.result is not None
    assert outcome.result.structured == {"tool": "write_file", "args": {"path": "a.txt"}, "authorized": True}
    assert outcome.result.content[0]["type"] == "text"
    assert upstream_state.meta[0]["writ/idempotencyKey"] == "k-42"
    assert upstream_state.meta[0]["writ/commitDeadline"] == "2026-12-01T15:40:00.000Z"
    assert TOKEN not in repr(outcome)


async def test_an_upstream_error_result_of_a_tool_with_an_effect_is_unknown_and_keeps_what_it_said(
    files: Registry,
) -> None:
    # An upstream's tool may fail after it acted: the SDK's servers answer isError for any exception.
    outcome = await call(files, "fail")

    assert (outcome.kind, outcome.error, outcome.detail) == ("unknown", "tool_error", "disk full")
    assert outcome.result is None
    assert outcome.evidence["answer"] == {
        "content": [{"type": "text", "text": "disk full"}],
        "structuredContent": None,
        "isError": True,
    }


@pytest.mark.parametrize("where", ["defaults", "overrides"])
async def test_an_upstream_error_result_is_failed_where_the_operator_says_errors_come_before_any_effect(
    upstream_url: str, where: str
) -> None:
    settings = {"tool_errors": "before_effect"}
    placed = {"defaults": settings} if where == "defaults" else {"overrides": {"fail": settings}}
    async with build(files_backend(upstream_url, tools=["fail"], **placed)) as registry:
        outcome = await call(registry, "fail")

    assert (outcome.kind, outcome.error, outcome.detail) == ("failed", "tool_error", "disk full")
    assert outcome.result is not None and outcome.result.is_error
    assert outcome.result.content == ({"type": "text", "text": "disk full"},)


async def test_an_upstream_error_result_of_a_read_is_failed(upstream_url: str) -> None:
    backend = files_backend(upstream_url, tools=["fail"], overrides={"fail": {"effect": "read"}})
    async with build(backend) as registry:
        outcome = await call(registry, "fail")

    assert (outcome.kind, outcome.error) == ("failed", "tool_error")
    assert outcome.result is not None and outcome.result.content == ({"type": "text", "text": "disk full"},)


async def test_a_write_that_times_out_is_unknown_and_sent_once(
    files: Registry, upstream_state: ServerState
) -> None:
    outcome = await call(files, "hang")

    assert (outcome.kind, outcome.error) == ("unknown", "response_timeout")
    assert upstream_state.hits["hang"] == 1


async def test_a_handler_that_raises_is_unknown_for_an_effect(
    files: Registry, upstream_state: ServerState
) -> None:
    outcome = await call(files, "boom")

    assert outcome.kind == "unknown"
    assert upstream_state.hits["boom"] == 1


async def test_concurrent_calls_share_one_session(files: Registry, upstream_state: ServerState) -> None:
    outcomes: list[Outcome] = []

    async def one(i: int) -> None:
        outcomes.append(await call(files, "slow", {"i": i}))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(one, i)

    assert [o.kind for o in outcomes] == ["completed"] * 8
    # One session, and the calls on it are not queued behind each other: the upstream ran several at once.
    assert upstream_state.most_slow_in_flight > 1
    assert upstream_state.hits["slow"] == 8


async def test_discovery_refuses_config_that_names_unknown_upstream_tools(upstream_url: str) -> None:
    registry = build(files_backend(upstream_url, tools=["read_file", "no_such_tool"]))

    with pytest.raises(ConfigError, match="no_such_tool"):
        await registry.start()


async def test_discovery_refuses_an_override_redacting_a_field_the_upstream_tool_lacks(
    upstream_url: str,
) -> None:
    # `redact: [pth]` redacted nothing: the path was stored and shown in clear.
    registry = build(files_backend(upstream_url, overrides={"read_file": {"redact": ["pth"]}}))

    with pytest.raises(ConfigError, match=r"overrides.read_file.redact names pth"):
        await registry.start()


async def test_two_upstream_tools_exposed_under_one_name_are_refused(upstream_url: str) -> None:
    registry = build(files_backend(upstream_url, rename={"fail": "read_file"}))

    with pytest.raises(ConfigError, match="read_file"):
        await registry.start()


async def test_an_unreachable_upstream_fails_start() -> None:
    registry = build(files_backend(f"http://127.0.0.1:{free_port()}/mcp", timeout_s=2))

    with anyio.fail_after(10), pytest.raises(BackendUnavailable):
        await registry.start()


async def test_an_http_upstream_that_went_away_is_unreachable_until_it_returns_then_reopened() -> None:
    state = ServerState()
    port = free_port()
    with serve(mcp_upstream_server(state).streamable_http_app(), state, port=port) as url:
        registry = build(files_backend(f"{url}/mcp", timeout_s=3))
        await registry.start()
        assert (await call(registry, "write_file")).kind == "completed"
    try:
        lost = await call(registry, "write_file")  # may have been sent: never reported as failed-and-safe
        down = await call(registry, "write_file")
        with serve(mcp_upstream_server(state).streamable_http_app(), state, port=port):
            back = await call(registry, "write_file")
    finally:
        await registry.close()

    assert (lost.kind, lost.error) in {("unknown", "connection_lost"), ("failed", "backend_unreachable")}
    assert (down.kind, down.error) == ("failed", "backend_unreachable")
    assert back.kind == "completed"


async def test_an_upstream_tool_without_a_reconcile_lookup_cannot_be_reconciled(files: Registry) -> None:
    cap = files.get("fs_write")
    assert cap is not None and not cap.reconcilable
    with pytest.raises(CapabilityError):
        await files.executor(cap).reconcile(invocation(cap))


def with_lookup(url: str, tool: str, **arguments: Any) -> dict[str, Any]:
    lookup = {"tool": tool, "arguments": arguments or {"key": "{idempotency_key}"}}
    return files_backend(
        url, tools=["read_file", "write_file"], overrides={"write_file": {"reconcile": lookup}}
    )


async def test_a_write_the_lookup_tool_lists_reconciles_as_succeeded_with_that_record(
    upstream_url: str, upstream_state: ServerState
) -> None:
    async with build(with_lookup(upstream_url, "find_writes")) as registry:
        cap = registry.get("write_file")
        assert cap is not None and cap.reconcilable
        written = invocation(cap, {"path": "/tmp/a"}, idempotency_key="k-written")
        assert (await registry.executor(cap).execute(written)).kind == "completed"

        found = await registry.executor(cap).reconcile(written)
        missing = await registry.executor(cap).reconcile(invocation(cap, idempotency_key="k-never"))

    assert found.verdict == "succeeded"
    assert found.result is not None
    assert found.result.structured == {"key": "k-written", "args": {"path": "/tmp/a"}}
    assert (found.evidence["lookup_tool"], found.evidence["records"]) == ("find_writes", 1)
    assert missing.verdict == "not_found"
    assert upstream_state.bodies[-2:] == [{"key": "k-written"}, {"key": "k-never"}]


async def test_a_found_flag_decides_and_templates_fill_from_the_call(
    upstream_url: str, upstream_state: ServerState
) -> None:
    lookup = {"tool": "find_write", "arguments": {"key": "{idempotency_key}", "why": "call {tool_call_id}"}}
    backend = files_backend(upstream_url, tools=["read_file", "write_file"], defaults={"reconcile": lookup})
    async with build(backend) as registry:
        read, write = registry.get("read_file"), registry.get("write_file")
        assert read is not None and write is not None
        written = invocation(write, {"path": "/tmp/b"}, idempotency_key="k-flag", tool_call_id="tc-1")
        await registry.executor(write).execute(written)

        found = await registry.executor(write).reconcile(written)
        missing = await registry.executor(write).reconcile(invocation(write, tool_call_id="tc-2"))

    assert not read.reconcilable  # a read has no effect to look up
    assert found.verdict == "succeeded"
    assert found.result is not None and found.result.structured == {
        "key": "k-flag",
        "args": {"path": "/tmp/b"},
    }
    assert missing.verdict == "not_found"
    assert upstream_state.bodies[-2] == {"key": "k-flag", "why": "call tc-1"}


@pytest.mark.parametrize(
    ("answer", "declared", "verdict", "error"),
    [
        # Trial 5: a ledger's lookup tool answering this, with no such transfer, settled it completed.
        ({"transfers": [], "count": 0}, {}, "inconclusive", "unidentified_record"),
        ({"transfers": [], "count": 0}, {"records": "/transfers"}, "not_found", None),
        # Two members: one record, holding this call's key and a state that may mean failure.
        (
            {"transfers": [{"key": "k-t", "state": "failed"}], "count": 1},
            {},
            "inconclusive",
            "record_state_undeclared",
        ),
        (
            {"transfers": [{"key": "k-t", "state": "failed"}], "count": 1},
            {"records": "/transfers"},
            "inconclusive",
            "record_state_undeclared",
        ),
        (
            {"transfers": [{"key": "k-t", "state": "failed"}], "count": 1},
            {
                "records": "/transfers",
                "outcome": {"field": "/state", "succeeded": ["done"], "failed": ["failed"]},
            },
            "failed",
            None,
        ),
        (
            {"transfers": [{"key": "k-t", "state": "done"}], "count": 1},
            {
                "records": "/transfers",
                "outcome": {"field": "/state", "succeeded": ["done"], "failed": ["failed"]},
            },
            "succeeded",
            None,
        ),
    ],
)
async def test_a_lookup_tools_answer_is_read_as_its_declaration_says(
    upstream_url: str,
    upstream_state: ServerState,
    answer: dict[str, Any],
    declared: dict[str, Any],
    verdict: str,
    error: str | None,
) -> None:
    upstream_state.answer = (200, json.dumps(answer))
    lookup = {"tool": "find_answer", "arguments": {"key": "{idempotency_key}"}, **declared}
    backend = files_backend(
        upstream_url, tools=["write_file"], overrides={"write_file": {"reconcile": lookup}}
    )
    async with build(backend) as registry:
        cap = registry.get("write_file")
        assert cap is not None
        found = await registry.executor(cap).reconcile(invocation(cap, idempotency_key="k-t"))

    assert (found.verdict, found.evidence.get("error")) == (verdict, error)
    assert found.evidence["lookup_tool"] == "find_answer"


async def test_a_lookup_tool_that_reports_an_error_is_inconclusive(upstream_url: str) -> None:
    async with build(with_lookup(upstream_url, "fail")) as registry:
        cap = registry.get("write_file")
        assert cap is not None
        result = await registry.executor(cap).reconcile(invocation(cap))

    assert (result.verdict, result.evidence["error"]) == ("inconclusive", "lookup_tool_error")


async def test_a_lookup_naming_a_value_the_call_lacks_is_inconclusive_and_sends_nothing(
    upstream_url: str, upstream_state: ServerState
) -> None:
    async with build(with_lookup(upstream_url, "find_writes", key="{order_id}")) as registry:
        cap = registry.get("write_file")
        assert cap is not None
        result = await registry.executor(cap).reconcile(invocation(cap, {"path": "/tmp/c"}))

    assert (result.verdict, result.evidence["missing"]) == ("inconclusive", "order_id")
    assert upstream_state.hits["find_writes"] == 0


async def test_a_lookup_tool_the_upstream_does_not_list_is_refused_at_discovery(upstream_url: str) -> None:
    registry = build(with_lookup(upstream_url, "no_such_lookup"))

    with pytest.raises(ConfigError, match="reconcile names no_such_lookup"):
        await registry.start()


# --- stdio ------------------------------------------------------------------------------------------


@pytest.fixture
def gate(tmp_path: Path) -> Path:
    path = tmp_path / "gate"
    path.touch()
    return path


def stdio_registry(gate: Path) -> Registry:
    backend = {
        "type": "mcp",
        "command": [sys.executable, str(STDIO_SCRIPT)],
        "env": {"GATE_FILE": str(gate), "EXPECTED_SECRET": "child-secret"},
        "env_from": {"UPSTREAM_SECRET": "HOST_SECRET"},
        "defaults": {"effect": "write"},
        "timeout_s": 10,
    }
    return Registry.from_config(parse_config({"local": backend}, []), environ={"HOST_SECRET": "child-secret"})


async def test_a_stdio_upstream_is_called_with_secrets_passed_through_its_environment(gate: Path) -> None:
    async with stdio_registry(gate) as registry:
        assert [cap.tool_name for cap in registry.capabilities()] == ["whoami", "crash"]
        outcome = await call(registry, "whoami", idempotency_key="k-7")

    assert outcome.kind == "completed" and outcome.result is not None
    assert outcome.result.structured is not None
    assert outcome.result.structured["has_secret"] is True
    assert outcome.result.structured["key"] == "k-7"


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"command": ["/nonexistent/server"]}, "command '/nonexistent/server' cannot be started"),
        (
            {"command": [sys.executable, "-c", "pass"], "cwd": "/nonexistent"},
            "cwd '/nonexistent' is not a dir",
        ),
    ],
)
async def test_a_stdio_upstream_that_cannot_be_spawned_names_the_command_or_the_cwd(
    settings: dict[str, Any], named: str
) -> None:
    # Both were "cannot connect: FileNotFoundError: [Errno 2] No such file or directory".
    registry = Registry.from_config(parse_config({"local": {"type": "mcp", **settings}}, []))

    with pytest.raises(BackendUnavailable, match=named):
        await registry.start()


async def test_a_dead_stdio_session_is_reopened_on_the_next_call(gate: Path) -> None:
    async with stdio_registry(gate) as registry:
        first = await call(registry, "whoami")
        crashed = await call(registry, "crash")
        gate.touch()
        again = await call(registry, "whoami")

    assert (crashed.kind, crashed.error) == ("unknown", "connection_lost")
    assert again.kind == "completed"
    assert again.result is not None and first.result is not None
    assert again.result.structured["pid"] != first.result.structured["pid"]  # type: ignore[index]


async def test_a_session_that_cannot_be_reopened_fails_the_call_as_unreachable(gate: Path) -> None:
    async with stdio_registry(gate) as registry:
        await call(registry, "crash")  # removes the gate: the upstream now refuses to start
        outcome = await call(registry, "whoami")

    assert (outcome.kind, outcome.error) == ("failed", "backend_unreachable")


def test_an_upstreams_contract_names_its_literal_headers_and_environment_but_holds_no_value() -> None:
    # The contract's hash is recorded with every call: a literal credential must not be guessable from it.
    stdio = {"type": "mcp", "command": [sys.executable, "-c", "pass"], "env": {"API_KEY": "literal-secret"}}
    http = {"type": "mcp", "url": "http://upstream.test/mcp", "headers": {"X-Key": "literal-secret"}}
    tool = mcp_types.Tool(name="read_file", input_schema={"type": "object"})

    definitions = [
        capabilities_from_tools("files", McpBackend.model_validate(b), [tool])[0].definition
        for b in (stdio, http)
    ]

    assert definitions[0]["backend"]["env"] == ["API_KEY"]
    assert definitions[1]["backend"]["headers"] == ["X-Key"]
    assert "literal-secret" not in repr(definitions)
