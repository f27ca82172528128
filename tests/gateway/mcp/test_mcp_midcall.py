"""What an upstream MCP server says during a tool call reaches the official client that made the call
(progress, log messages at its level, elicitation, sampling), a cancel reaches the upstream, and the
record holds what was asked.

One gateway (in-process, `inproc.py`) fronts the same upstream (`chatty_upstream.py`) four times: over
streamable HTTP in this process and over stdio as a child process, each spoken to in the 2025-11-25
era (`legacy`) and in 2026-07-28. Their tools are renamed `<backend>_<tool>`.
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
from mcp.client.session import ClientRequestContext
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError

from capabilities.mcp_midcall import DETACHED, UNATTRIBUTED
from capabilities.mcp_upstream import required_capabilities
from gateway.calls.actions import DIGEST_PREFIX
from gateway.mcp.midcall import NOT_DECLARED
from gateway.mcp.parked import GONE
from tests.e2e.harness import free_port
from tests.eventually import eventually
from tests.gateway.mcp import chatty_upstream
from tests.gateway.mcp.chatty_upstream import ASKED, CANCELLED, chatty_app
from tests.gateway.mcp.inproc import Backend, Writ, acme, serving, writ
from tests.postgres import fresh_schema

pytestmark = pytest.mark.anyio

TOOLS = ["count", "wait", "ask", "think", "needy"]
UPSTREAMS = {
    "hl": ("http", "legacy"),
    "hm": ("http", "2026-07-28"),
    "sl": ("stdio", "legacy"),
    "sm": ("stdio", "2026-07-28"),
}
CLIENT_MODES = ["legacy", "2026-07-28"]


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    with acme(tmp_path_factory.mktemp("acme")) as b:
        yield b


@pytest.fixture(scope="module")
def chatty_url() -> Iterator[str]:
    port = free_port()
    config = uvicorn.Config(chatty_app("http"), host="127.0.0.1", port=port, log_level="warning")
    with serving(config):
        yield f"http://127.0.0.1:{port}/mcp"


def _upstreams(url: str) -> dict[str, Any]:
    backends: dict[str, Any] = {}
    for name, (transport, mode) in UPSTREAMS.items():
        where: dict[str, Any] = (
            {"url": url}
            if transport == "http"
            else {"command": [sys.executable, chatty_upstream.__file__, name]}
        )
        backends[name] = {
            "type": "mcp",
            **where,
            "mode": mode,
            "timeout_s": 10,
            "rename": {tool: f"{name}_{tool}" for tool in TOOLS},
            # Its tools err only when the client could not be asked, before they do anything.
            "defaults": {"tool_errors": "before_effect"},
            "overrides": {"ask": {"redact": ["pin"]}},
            "prompts": {"prefix": f"{name}_", "redact": {"sign": ["pin"]}},
        }
    return backends


RULES = [
    {
        "id": "agents-talk",
        "tools": [f"{name}_{tool}" for name in UPSTREAMS for tool in TOOLS],
        "roles": ["agent"],
        "decision": "allow",
    },
    {
        "id": "agents-sign",
        "prompts": [f"{name}_sign" for name in UPSTREAMS],
        "roles": ["agent"],
        "decision": "allow",
    },
    {
        "id": "questions-for-the-boss-need-approval",
        "tools": ["hl_ask", "sl_ask"],
        "when": "args.question == 'May I?'",
        "decision": "require_approval",
        "approval": {"approver_role": "approver"},
    },
]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, backend: Backend, chatty_url: str) -> Iterator[Writ]:
    workdir: Path = tmp_path_factory.mktemp("writ")
    store = f"sqlite:///{workdir / 'writ.db'}"
    with writ(workdir, backend, store, extra_backends=_upstreams(chatty_url), extra_rules=RULES) as g:
        yield g


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def recording(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    gateway: Writ,
    backend: Backend,
    chatty_url: str,
    postgres_url: str,
) -> Iterator[Writ]:
    """The module's gateway (SQLite), or one of its own on PostgreSQL."""
    if request.param == "sqlite":
        yield gateway
        return
    workdir = tmp_path_factory.mktemp("writ-pg")
    with (
        fresh_schema(postgres_url, "writ_midcall") as store,
        writ(workdir, backend, store, extra_backends=_upstreams(chatty_url), extra_rules=RULES) as g,
    ):
        yield g


def _key() -> dict[str, Any]:
    return {"writ/idempotencyKey": uuid.uuid4().hex}


def _text(result: types.CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, types.TextContent))


def _relayed(gateway: Writ, result: types.CallToolResult) -> dict[str, Any]:
    """What the call's outcome event recorded of what was relayed."""
    tool_call_id = (result.meta or {})["writ/toolCallId"]
    with gateway.store() as store:
        [settled] = [
            e
            for e in store.events(tool_call_id=tool_call_id)
            if e.type in ("tool_call.completed", "tool_call.failed")
        ]
    relayed: dict[str, Any] = settled.payload["evidence"]["relayed"]
    return relayed


@pytest.mark.parametrize("upstream", list(UPSTREAMS))
@pytest.mark.parametrize("mode", CLIENT_MODES)
async def test_progress_and_log_messages_reach_the_client_at_the_level_it_asked(
    gateway: Writ, upstream: str, mode: str
) -> None:
    progress: list[tuple[float, float | None, str | None]] = []
    logs: list[tuple[str, Any]] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append((done, total, message))

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logs.append((params.level, params.data))

    token = gateway.token("ann", roles="agent")
    level: dict[str, Any] = {"log_level": "info"} if mode != "legacy" else {}
    async with gateway.client(token, mode=mode, logging_callback=on_log, **level) as client:
        if mode == "legacy":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", MCPDeprecationWarning)
                await client.set_logging_level("info")
        result = await client.call_tool(
            f"{upstream}_count", {"n": 3}, progress_callback=on_progress, meta=_key()
        )
    assert _text(result) == "counted to 3"
    assert progress == [(1, 3, "step 1 of 3"), (2, 3, "step 2 of 3"), (3, 3, "step 3 of 3")]
    name = "http" if upstream.startswith("h") else upstream
    assert logs == [("info", f"{name} counted at info"), ("warning", f"{name} counted at warning")]
    assert _relayed(gateway, result) == {"progress": 3, "logMessages": 2}


async def test_a_2026_client_that_asks_for_no_log_messages_is_given_none(gateway: Writ) -> None:
    logs: list[Any] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logs.append(params)

    async with gateway.client(
        gateway.token("ann", roles="agent"), mode="2026-07-28", logging_callback=on_log
    ) as c:
        result = await c.call_tool("hl_count", {"n": 1}, meta=_key())
    assert _text(result) == "counted to 1"
    assert logs == []


def _answer(name: str, pin: str) -> Any:
    async def elicit(context: ClientRequestContext, params: types.ElicitRequestParams) -> types.ElicitResult:
        assert isinstance(params, types.ElicitRequestFormParams)
        assert params.message == "Who signs?"
        return types.ElicitResult(action="accept", content={"name": name, "pin": pin})

    return elicit


# Not digits alone: a salted digest in the export may hold any run of hex digits by chance.
PIN = "pin-8642-ok"


@pytest.mark.parametrize("upstream", list(UPSTREAMS))
async def test_an_upstream_elicitation_reaches_the_user_and_its_pin_is_recorded_only_as_a_hash(
    recording: Writ, upstream: str
) -> None:
    gateway = recording
    token = gateway.token("ann", roles="agent")
    async with gateway.client(token, mode="legacy", elicitation_callback=_answer("Ann", PIN)) as client:
        result = await client.call_tool(f"{upstream}_ask", {"question": "Who signs?"}, meta=_key())
    assert _text(result) == f"accept: Ann with a PIN of {len(PIN)}"
    [asked] = _relayed(gateway, result)["exchanges"]
    assert asked["kind"] == "elicitation"
    assert (asked["message"], asked["mode"], asked["action"]) == ("Who signs?", "form", "accept")
    assert asked["requestedSchema"] == chatty_upstream.PIN_SCHEMA
    assert asked["content"]["name"] == "Ann"
    assert asked["content"]["pin"].startswith(DIGEST_PREFIX)
    assert PIN not in gateway.exported()


@pytest.mark.parametrize("upstream", ["hl", "hm"])
@pytest.mark.parametrize("mode", CLIENT_MODES)
async def test_an_upstream_that_checks_the_clients_capabilities_does_not_ask_one_that_cannot_answer(
    recording: Writ, upstream: str, mode: str
) -> None:
    """An upstream over HTTP hears the calling client's capabilities, not Writ's own (SEP-2322's
    respect-client-capabilities): without elicitation it answers at once; with it, it asks."""
    gateway = recording
    token = gateway.token("ann", roles="agent")
    arguments = {"question": "Who signs?", "polite": True}
    async with gateway.client(token, mode=mode) as client:
        result = await client.call_tool(f"{upstream}_ask", arguments, meta=_key())
    assert (_text(result), result.is_error) == (chatty_upstream.POLITE, False)
    tool_call_id = (result.meta or {})["writ/toolCallId"]
    with gateway.store() as store:
        [settled] = [e for e in store.events(tool_call_id=tool_call_id) if e.type == "tool_call.completed"]
    assert "relayed" not in settled.payload["evidence"]  # nothing was asked, nothing refused
    async with gateway.client(token, mode=mode, elicitation_callback=_answer("Ann", PIN)) as client:
        result = await client.call_tool(f"{upstream}_ask", arguments, meta=_key())
    assert _text(result) == f"accept: Ann with a PIN of {len(PIN)}"
    [asked] = _relayed(gateway, result)["exchanges"]
    assert (asked["kind"], asked["action"]) == ("elicitation", "accept")


async def test_an_elicitation_a_client_did_not_declare_is_refused_to_a_2025_upstream(gateway: Writ) -> None:
    async with gateway.client(gateway.token("ann", roles="agent"), mode="legacy") as client:
        result = await client.call_tool("hl_ask", {"question": "Who signs?"}, meta=_key())
    # The upstream was told the client cannot be asked; asking anyway, it heard the SDK client's
    # refusal (Writ's client, on a session without elicitation) and answered with a tool error.
    assert result.is_error
    assert _text(result) == "not asked: Elicitation not supported"


async def test_an_elicitation_a_client_did_not_declare_is_refused_by_writ_to_a_stdio_upstream(
    gateway: Writ,
) -> None:
    async with gateway.client(gateway.token("ann", roles="agent"), mode="legacy") as client:
        result = await client.call_tool("sl_ask", {"question": "Who signs?"}, meta=_key())
    # One upstream process hears Writ's own capabilities; Writ refuses and records the refusal.
    assert result.is_error
    assert _text(result).startswith("not asked: Writ: " + NOT_DECLARED.format("elicitation"))
    [asked] = _relayed(gateway, result)["exchanges"]
    assert asked["refused"] == NOT_DECLARED.format("elicitation")


@pytest.mark.parametrize("upstream", ["hm", "sm"])
async def test_an_elicitation_a_client_did_not_declare_fails_a_2026_call_without_a_retry(
    gateway: Writ, upstream: str
) -> None:
    before = ASKED["http:ask"] if upstream == "hm" else None
    async with gateway.client(gateway.token("ann", roles="agent"), mode="legacy") as client:
        result = await client.call_tool(f"{upstream}_ask", {"question": "Who signs?"}, meta=_key())
    assert result.is_error
    document = result.structured_content or {}
    assert (document["status"], document["error"]) == ("failed", "upstream_input_refused")
    if before is not None:
        assert ASKED["http:ask"] == before + 1  # asked once, never retried with an answer


@pytest.mark.parametrize("upstream", list(UPSTREAMS))
async def test_a_2026_client_answers_an_upstream_elicitation_in_an_input_required_round(
    recording: Writ, upstream: str
) -> None:
    """The upstream call stays open while the client's SDK answers Writ's round and calls again."""
    gateway = recording
    token = gateway.token("ann", roles="agent")
    async with gateway.client(token, mode="2026-07-28", elicitation_callback=_answer("Ann", PIN)) as client:
        result = await client.call_tool(f"{upstream}_ask", {"question": "Who signs?"}, meta=_key())
    assert _text(result) == f"accept: Ann with a PIN of {len(PIN)}"
    [asked] = _relayed(gateway, result)["exchanges"]
    assert (asked["kind"], asked["via"], asked["action"]) == ("elicitation", "input_required", "accept")
    assert asked["requestedSchema"] == chatty_upstream.PIN_SCHEMA
    assert asked["content"]["name"] == "Ann"
    assert asked["content"]["pin"].startswith(DIGEST_PREFIX)
    assert PIN not in gateway.exported()


@pytest.mark.parametrize("upstream", list(UPSTREAMS))
async def test_a_2026_client_answers_what_an_upstream_asks_during_a_prompt_get_in_a_round(
    recording: Writ, upstream: str
) -> None:
    """A relayed prompts/get asks in rounds as a tool call does: the get stays decided and recorded as
    one, with what was asked (the PIN, which the prompt's redaction names, only as a hash)."""
    gateway = recording
    subject = f"signer-{upstream}"
    prompt = f"{upstream}_sign"
    accept = types.ElicitResult(action="accept", content={"name": "Bo", "pin": PIN})
    token = gateway.token(subject, roles="agent")
    async with gateway.client(token, mode="2026-07-28", elicitation_callback=_answer("Ann", PIN)) as client:
        got = await client.get_prompt(prompt)  # the SDK answers the rounds itself
        first = await client.session.get_prompt(prompt, allow_input_required=True)
        assert isinstance(first, types.InputRequiredResult)
        [(key, request)] = (first.input_requests or {}).items()
        assert isinstance(request, types.ElicitRequest)
        assert request.params.message == "Who signs?"
        done = await client.session.get_prompt(
            prompt,
            input_responses={key: accept},
            request_state=first.request_state,
            allow_input_required=True,
        )
    said = [
        m.content.text for r in (got, done) for m in r.messages if isinstance(m.content, types.TextContent)
    ]
    assert said == ["Signed by Ann", "Signed by Bo"]
    calls = [c for c in gateway.recorded_calls() if c.subject == subject]
    assert [(c.tool_name, c.status) for c in calls] == [(prompt, "completed")] * 2
    for call in calls:
        with gateway.store() as store:
            [settled] = [
                e for e in store.events(tool_call_id=call.tool_call_id) if e.type == "tool_call.completed"
            ]
        [asked] = settled.payload["evidence"]["relayed"]["exchanges"]
        assert (asked["kind"], asked["via"], asked["action"]) == ("elicitation", "input_required", "accept")
        assert asked["content"]["name"] in ("Ann", "Bo")
        assert asked["content"]["pin"].startswith(DIGEST_PREFIX)
    assert PIN not in gateway.exported()


@pytest.mark.parametrize("upstream", list(UPSTREAMS))
async def test_a_2026_client_answers_an_upstream_sampling_request_in_an_input_required_round(
    gateway: Writ, upstream: str
) -> None:
    async def sample(
        context: ClientRequestContext, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult:
        [message] = params.messages
        assert isinstance(message.content, types.TextContent)
        text = message.content.text[::-1]
        return types.CreateMessageResult(
            role="assistant",
            content=types.TextContent(type="text", text=text),
            model="m2",
            stop_reason="endTurn",
        )

    token = gateway.token("ann", roles="agent")
    async with gateway.client(token, mode="2026-07-28", sampling_callback=sample) as client:
        result = await client.call_tool(f"{upstream}_think", {"prompt": "hello"}, meta=_key())
    assert _text(result) == "m2 says: olleh"
    [asked] = _relayed(gateway, result)["exchanges"]
    assert (asked["kind"], asked["via"], asked["model"]) == ("sampling", "input_required", "m2")
    assert asked["messages"] == [{"role": "user", "content": {"type": "text", "text": "hello"}}]


@pytest.mark.parametrize(("upstream", "key"), [("hl", "writ/1"), ("sm", "it")])
async def test_a_round_names_the_upstreams_request_by_its_key_asks_again_until_answered_and_ends_once(
    gateway: Writ, upstream: str, key: str
) -> None:
    """Driven by hand: a 2026-07-28 upstream's own key is kept (a 2025-11-25 upstream's request gets
    Writ's); an answer that is missing or under another key is asked for again; a round's state is
    good for the one call it belongs to, and not once the call has ended."""
    token = gateway.token("ann", roles="agent")
    tool = f"{upstream}_ask"
    arguments = {"question": "Who signs?"}
    accept = types.ElicitResult(action="accept", content={"name": "Bo", "pin": "1234"})
    async with gateway.client(token, mode="2026-07-28", elicitation_callback=_answer("-", "-")) as client:
        first = await client.session.call_tool(tool, arguments, meta=_key(), allow_input_required=True)
        assert isinstance(first, types.InputRequiredResult)
        [(asked_key, request)] = (first.input_requests or {}).items()
        assert asked_key == key
        assert isinstance(request, types.ElicitRequest)
        assert request.params.message == "Who signs?"
        again = await client.session.call_tool(
            tool,
            arguments,
            input_responses={"other": accept},
            request_state=first.request_state,
            allow_input_required=True,
        )
        assert isinstance(again, types.InputRequiredResult)
        assert list(again.input_requests or {}) == [key]
        assert again.request_state != first.request_state
        done = await client.session.call_tool(
            tool,
            arguments,
            input_responses={key: accept},
            request_state=again.request_state,
            allow_input_required=True,
        )
        assert isinstance(done, types.CallToolResult)
        assert _text(done) == "accept: Bo with a PIN of 4"
        with pytest.raises(MCPError) as gone:
            await client.session.call_tool(
                tool,
                arguments,
                input_responses={key: accept},
                request_state=again.request_state,
                allow_input_required=True,
            )
    assert gone.value.code == types.INVALID_PARAMS
    assert gone.value.message == GONE


@pytest.mark.parametrize("upstream", list(UPSTREAMS))
async def test_an_upstream_sampling_request_reaches_the_clients_model(gateway: Writ, upstream: str) -> None:
    async def sample(
        context: ClientRequestContext, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult:
        [message] = params.messages
        assert isinstance(message.content, types.TextContent)
        return types.CreateMessageResult(
            role="assistant",
            content=types.TextContent(type="text", text=message.content.text.upper()),
            model="model-x",
            stop_reason="endTurn",
        )

    token = gateway.token("ann", roles="agent")
    async with gateway.client(token, mode="legacy", sampling_callback=sample) as client:
        result = await client.call_tool(f"{upstream}_think", {"prompt": "hello"}, meta=_key())
    assert _text(result) == "model-x says: HELLO"
    [asked] = _relayed(gateway, result)["exchanges"]
    assert (asked["kind"], asked["model"], asked["stopReason"], asked["maxTokens"]) == (
        "sampling",
        "model-x",
        "endTurn",
        50,
    )
    assert asked["messages"] == [{"role": "user", "content": {"type": "text", "text": "hello"}}]


@pytest.mark.parametrize("upstream", list(UPSTREAMS))
@pytest.mark.parametrize("mode", CLIENT_MODES)
async def test_an_upstream_refusal_for_a_missing_client_capability_reaches_the_client_as_such(
    recording: Writ, upstream: str, mode: str
) -> None:
    gateway = recording
    async with gateway.client(gateway.token("ann", roles="agent"), mode=mode) as client:
        with pytest.raises(MCPError) as refused:
            await client.call_tool(f"{upstream}_needy", {}, meta=_key())
    # SEP-2575: a JSON-RPC error with the upstream's code and requiredCapabilities, not a tool error.
    error = refused.value
    assert error.code == -32021
    assert chatty_upstream.NEEDS_SAMPLING in error.message
    data = error.data or {}
    assert data["requiredCapabilities"] == {"sampling": {}}
    assert (data["status"], data["error"]) == ("failed", "mcp_error_32021")
    with gateway.store() as store:
        call = store.get_call(data["toolCallId"])
    assert call is not None
    assert (call.status, call.error) == ("failed", "mcp_error_32021")
    assert (call.result or {})["structuredContent"] == {"requiredCapabilities": {"sampling": {}}}


async def test_a_malformed_missing_capability_refusal_stays_a_tool_error() -> None:
    """Only a well-formed `requiredCapabilities` (an object of objects) makes the call's answer an error."""
    for data in (None, {"requiredCapabilities": ["sampling"]}, {"requiredCapabilities": {}}, {"x": 1}):
        assert required_capabilities(MCPError(-32021, "needs", data)) is None
    assert required_capabilities(MCPError(-32602, "x", {"requiredCapabilities": {"sampling": {}}})) is None
    assert required_capabilities(MCPError(-32021, "x", {"requiredCapabilities": {"roots": {}}})) == {
        "roots": {}
    }


@pytest.mark.parametrize("upstream", ["hl", "hm", "sl", "sm"])
@pytest.mark.parametrize("mode", CLIENT_MODES)
async def test_a_client_cancel_cancels_the_upstream_request_and_leaves_the_write_unknown(
    gateway: Writ, upstream: str, mode: str
) -> None:
    before = CANCELLED["http"]
    started = anyio.Event()

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        started.set()

    key = _key()
    async with (
        gateway.client(gateway.token("ann", roles="agent"), mode=mode) as client,
        anyio.create_task_group() as group,
    ):

        async def call() -> None:
            await client.call_tool(f"{upstream}_wait", {}, progress_callback=on_progress, meta=key)

        group.start_soon(call)
        with anyio.fail_after(10):
            await started.wait()
        group.cancel_scope.cancel()

    def unknown() -> list[Any]:
        calls = gateway.runtime.store.list_calls(status="result_unknown", limit=1000)
        return [c for c in calls if c.idempotency_key == key["writ/idempotencyKey"]]

    [call] = await eventually(unknown, lambda found: len(found) == 1)
    assert call.error == "cancelled_by_client"
    events = [e for e in gateway.runtime.store.events(tool_call_id=call.tool_call_id)]
    assert [e.type for e in events][-1] == "tool_call.result_unknown"
    assert events[-1].payload["evidence"]["relayed"]["exchanges"] == [{"kind": "cancelled", "by": "client"}]
    if upstream.startswith("h"):
        await eventually(lambda: CANCELLED["http"], lambda n: n == before + 1)


async def test_two_calls_in_flight_on_one_stdio_upstream_cannot_be_told_apart_and_are_refused(
    gateway: Writ,
) -> None:
    """Over stdio in the 2025-11-25 era nothing says which call a request belongs to."""
    started = anyio.Event()

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        started.set()

    token = gateway.token("ann", roles="agent")
    async with (
        gateway.client(token, mode="legacy", elicitation_callback=_answer("Ann", "1")) as client,
        anyio.create_task_group() as group,
    ):

        async def wait() -> None:
            await client.call_tool("sl_wait", {}, progress_callback=on_progress, meta=_key())

        group.start_soon(wait)
        with anyio.fail_after(10):
            await started.wait()
        result = await client.call_tool("sl_ask", {"question": "Who signs?"}, meta=_key())
        group.cancel_scope.cancel()
    assert result.is_error
    assert _text(result) == f"not asked: Writ: {UNATTRIBUTED}"


@pytest.mark.parametrize("upstream", ["hl", "sl"])
async def test_an_upstream_asking_during_a_call_run_after_approval_is_told_no_client_waits(
    gateway: Writ, upstream: str
) -> None:
    token = gateway.token("ann", roles="agent")
    async with gateway.client(token, mode="legacy", elicitation_callback=_answer("Ann", "1")) as client:
        held = await client.call_tool(f"{upstream}_ask", {"question": "May I?"}, meta=_key())
        pending = held.structured_content or {}
        assert pending["status"] == "approval_pending"
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

        done = await eventually(status, lambda s: s.get("status") in ("completed", "failed"))
    # The upstream heard why and answered with a tool error; nobody was asked in the client's name.
    assert (done["status"], done.get("error")) == ("failed", "tool_error")
    [failed] = [
        e
        for e in gateway.runtime.store.events(tool_call_id=pending["toolCallId"])
        if e.type == "tool_call.failed"
    ]
    assert failed.payload["detail"] == f"not asked: Writ: {DETACHED}"
