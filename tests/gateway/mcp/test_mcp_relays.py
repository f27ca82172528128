"""Resources, prompts and completions relayed from upstream MCP servers, as the official client hears
them in either protocol era, and what the record holds of each read and get.

One gateway (in-process, `inproc.py`) fronts two upstreams (`library_upstream.py`): `lib` over
streamable HTTP in this process, with the URI prefix `lib+` and the prompt prefix `lib_`; `box` over
stdio as a child process, with `box+` and a rename of its `summarize` prompt to `box_summary`.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
import uvicorn
from mcp import MCPError
from mcp_types import INVALID_PARAMS, SERVER_INFO_META_KEY

from capabilities.uris import uri_problem
from gateway.audit.security import SecurityEvents
from gateway.mcp.relays import REFUSED, RESOURCE_NOT_FOUND
from store import EventFilter
from tests.e2e.harness import free_port
from tests.eventually import eventually
from tests.gateway.mcp import library_upstream
from tests.gateway.mcp.inproc import Backend, Writ, acme, serving, writ
from tests.gateway.mcp.library_upstream import READS, library_app
from tests.postgres import fresh_schema

pytestmark = pytest.mark.anyio

MODES = ["legacy", "2026-07-28"]

RULES: list[dict[str, Any]] = [
    {
        "id": "agents-read-welcome-notes",
        "resources": ["*note://welcome"],
        "roles": ["agent"],
        "decision": "allow",
    },
    {
        "id": "agents-see-the-box-logo",
        "resources": ["box+file:///*"],
        "roles": ["agent"],
        "decision": "allow",
    },
    {"id": "readers-read-lib-notes", "resources": ["lib+note://*"], "roles": ["reader"], "decision": "allow"},
    # Would show bad's resources to anyone: bad's listings fail, so there are none to show.
    {"id": "anyone-reads-bad-notes", "resources": ["bad+*"], "decision": "allow"},
    {"id": "agents-summarize", "prompts": ["lib_*", "box_summary"], "roles": ["agent"], "decision": "allow"},
    {
        "id": "auditors-read-box-secrets-once-approved",
        "resources": ["box+note://secret"],
        "roles": ["auditor"],
        "decision": "require_approval",
        "approval": {"approver_role": "approver"},
        "message": "The box vault code is read only with an approver's consent.",
    },
    {
        "id": "payroll-summaries-need-approval",
        "prompts": ["box_summary"],
        "when": "args.topic == 'payroll'",
        "decision": "require_approval",
        "approval": {"approver_role": "approver"},
        "message": "Payroll summaries wait for an approver.",
    },
    {
        "id": "no-secret-summaries",
        "prompts": ["*summar*"],
        "when": "args.topic == 'secrets'",
        "decision": "deny",
        "reason": "secret_topic",
    },
]


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    with acme(tmp_path_factory.mktemp("acme")) as b:
        yield b


@pytest.fixture(scope="module")
def lib_url() -> Iterator[str]:
    port = free_port()
    config = uvicorn.Config(library_app("lib"), host="127.0.0.1", port=port, log_level="warning")
    with serving(config):
        yield f"http://127.0.0.1:{port}/mcp"


def _upstreams(lib_url: str) -> dict[str, Any]:
    return {
        "lib": {
            "type": "mcp",
            "url": lib_url,
            "timeout_s": 10,
            "resources": {"uri_prefix": "lib+"},
            "prompts": {"prefix": "lib_", "redact": {"summarize": ["topic"]}},
        },
        "box": {
            "type": "mcp",
            "command": [sys.executable, library_upstream.__file__, "box"],
            "timeout_s": 10,
            "resources": {"uri_prefix": "box+"},
            "prompts": {"rename": {"summarize": "box_summary"}},
        },
        # Lists no resources (every listing fails): left out of listings, the others still listed.
        "bad": {
            "type": "mcp",
            "command": [sys.executable, library_upstream.__file__, "bad", "--broken"],
            "timeout_s": 10,
            "resources": {"uri_prefix": "bad+"},
        },
    }


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, backend: Backend, lib_url: str) -> Iterator[Writ]:
    workdir: Path = tmp_path_factory.mktemp("writ")
    store = f"sqlite:///{workdir / 'writ.db'}"
    with writ(workdir, backend, store, extra_backends=_upstreams(lib_url), extra_rules=RULES) as g:
        yield g


def _text(result: types.ReadResourceResult) -> list[tuple[str, str]]:
    return [(c.uri, c.text) for c in result.contents if isinstance(c, types.TextResourceContents)]


@pytest.mark.parametrize("mode", MODES)
async def test_resources_of_two_upstreams_are_listed_apart_and_only_where_policy_allows(
    gateway: Writ, mode: str
) -> None:
    async with gateway.client(gateway.token("ann", roles="agent"), mode=mode) as client:
        listed = {r.uri for r in (await client.list_resources()).resources}
        templates = (await client.list_resource_templates()).resource_templates
    assert listed == {"lib+note://welcome", "box+note://welcome", "box+file:///logo.png"}
    assert templates == []  # no rule lets an agent read every note of either upstream
    async with gateway.client(gateway.token("rea", roles="reader"), mode=mode) as client:
        listed = {r.uri for r in (await client.list_resources()).resources}
        templates = (await client.list_resource_templates()).resource_templates
    assert listed == {"lib+note://welcome", "lib+note://secret"}
    assert [t.uri_template for t in templates] == ["lib+note://{note}"]


@pytest.mark.parametrize("mode", MODES)
async def test_a_read_goes_to_the_upstream_its_prefix_names_and_comes_back_prefixed(
    gateway: Writ, mode: str
) -> None:
    async with gateway.client(gateway.token("ann", roles="agent"), mode=mode) as client:
        lib = await client.read_resource("lib+note://welcome")
        box = await client.read_resource("box+note://welcome")
        logo = await client.read_resource("box+file:///logo.png")
    assert _text(lib) == [("lib+note://welcome", "Welcome to the lib library.")]
    assert _text(box) == [("box+note://welcome", "Welcome to the box library.")]
    [blob] = logo.contents
    assert isinstance(blob, types.BlobResourceContents)
    assert (blob.uri, blob.blob, blob.mime_type) == (
        "box+file:///logo.png",
        library_upstream.PNG,
        "image/png",
    )


@pytest.mark.parametrize("mode", MODES)
async def test_a_read_no_rule_allows_is_denied_with_its_reason_and_never_reaches_the_upstream(
    gateway: Writ, mode: str
) -> None:
    before = READS["lib:note://secret"]
    async with gateway.client(gateway.token("ann", roles="agent"), mode=mode) as client:
        with pytest.raises(MCPError) as denied:
            await client.read_resource("lib+note://secret")
    assert denied.value.code == REFUSED
    assert denied.value.data["status"] == "denied"
    assert denied.value.data["reason"] == "no_matching_rule"
    assert "no_matching_rule" in denied.value.message
    assert READS["lib:note://secret"] == before
    call = gateway.runtime.store.get_call(denied.value.data["toolCallId"])
    assert call is not None and (call.status, call.capability_id) == ("denied", "lib/resources")
    assert gateway.event_types(call.tool_call_id) == ["tool_call.requested", "tool_call.denied"]


async def test_a_rule_allowing_one_uri_pattern_lets_its_role_read_what_it_covers(gateway: Writ) -> None:
    async with gateway.client(gateway.token("rea", roles="reader")) as client:
        secret = await client.read_resource("lib+note://secret")
        with pytest.raises(MCPError) as denied:
            await client.read_resource("box+note://secret")
    assert _text(secret) == [("lib+note://secret", "The lib vault code is 0000.")]
    assert denied.value.data["reason"] == "no_matching_rule"


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def recording(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    gateway: Writ,
    backend: Backend,
    lib_url: str,
    postgres_url: str,
) -> Iterator[Writ]:
    """The module's gateway (SQLite), or one of its own on PostgreSQL."""
    if request.param == "sqlite":
        yield gateway
        return
    workdir = tmp_path_factory.mktemp("writ-pg")
    with (
        fresh_schema(postgres_url, "writ_relays") as store,
        writ(workdir, backend, store, extra_backends=_upstreams(lib_url), extra_rules=RULES) as g,
    ):
        yield g


async def test_a_read_is_recorded_as_a_read_class_call_of_its_principal(recording: Writ) -> None:
    gateway = recording
    before = READS["lib:note://welcome"]
    async with gateway.client(gateway.token("rec", roles="agent")) as client:
        await client.read_resource("lib+note://welcome")
    assert READS["lib:note://welcome"] == before + 1
    [call] = [c for c in gateway.recorded_calls() if c.subject == "rec"]
    assert (call.tool_name, call.capability_id, call.effect_class) == (
        "resources/read",
        "lib/resources",
        "read",
    )
    assert (call.status, call.decision_effect, call.reason) == (
        "completed",
        "allow",
        "agents-read-welcome-notes",
    )
    assert call.arguments == {"uri": "lib+note://welcome"}
    assert call.result is not None
    assert call.result["structuredContent"]["contents"][0]["text"] == "Welcome to the lib library."
    assert call.principal is not None and call.principal.roles == ("agent",)
    assert gateway.event_types(call.tool_call_id) == [
        "tool_call.requested",
        "tool_call.dispatching",
        "tool_call.completed",
    ]


async def test_a_read_held_for_approval_runs_once_approved_and_its_status_holds_the_content(
    gateway: Writ,
) -> None:
    async with gateway.client(gateway.token("aud", roles="auditor")) as client:
        with pytest.raises(MCPError) as held:
            await client.read_resource("box+note://secret")
        pending = held.value.data
        assert (held.value.code, pending["status"]) == (REFUSED, "approval_pending")
        # The rule's words for the user reach the client, as for a tool call held for approval.
        assert pending["message"] == "The box vault code is read only with an approver's consent."
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

        done = await eventually(status, lambda s: s.get("status") == "completed")
    assert done["result"]["structuredContent"]["contents"][0]["text"] == "The box vault code is 0000."


async def test_a_uri_no_upstream_serves_is_not_found_and_an_upstream_refusal_passes_through(
    gateway: Writ,
) -> None:
    async with gateway.client(gateway.token("ann", roles="agent")) as client:
        with pytest.raises(MCPError) as unknown:
            await client.read_resource("note://welcome")
        with pytest.raises(MCPError) as missing:
            await client.read_resource("box+note://nothing-here")
    assert (unknown.value.code, unknown.value.data) == (RESOURCE_NOT_FOUND, {"uri": "note://welcome"})
    # Denied first: policy decides before anything is asked of the upstream.
    assert missing.value.data["reason"] == "no_matching_rule"
    assert missing.value.data["uri"] == "box+note://nothing-here"
    async with gateway.client(gateway.token("rea", roles="reader")) as client:
        with pytest.raises(MCPError) as refused:
            await client.read_resource("lib+note://nothing-here")
    # Allowed, so asked: the upstream's own refusal (-32002) reaches the client, and is recorded.
    assert refused.value.code == -32002
    assert (refused.value.data["status"], refused.value.data["error"]) == ("failed", "mcp_error_32002")


# What each kind of URI gets. A rule's pattern is matched as written, while the upstream may decode,
# normalise and resolve it: refused (-32602, before policy) is any URI one of those readings could turn
# into another; everything else is asked as written.
URI_KINDS: list[tuple[str, str | None]] = [
    # Asked: names, however unusual, that no reading resolves elsewhere.
    ("file:///a/b.txt", None),
    ("file:///a/..b", None),  # dots that are not a whole segment
    ("file:///a/.../b", None),  # three dots are a name, on Windows too
    ("file:///a/b;v=1/c", None),  # a path parameter on a name
    ("https://x/y?q=1%20", None),
    ("https://x/y?q=a%25b", None),  # an encoded `%`: `a%b`, and no escape once decoded again
    ("note://x/%2541", None),  # a literal `%41`, or `A` to an upstream that decodes twice: either is here
    ("note://caf%C3%A9/na%C3%AFve", None),  # UTF-8, percent-encoded
    ("file:///a b.txt", None),  # a space inside a name
    # Dot-segments, as written or in any reading an upstream may make of the URI.
    ("file:///public/../etc/passwd", "the dot-segment '..', "),
    ("file:///public/./x", "the dot-segment '.', "),
    ("file:///public/%2e%2E/etc", "the dot-segment '..' once decoded"),
    ("file:///public/.%2e/etc", "the dot-segment '..' once decoded"),
    ("file:///public/%252e%252e/etc", "the dot-segment '..' once decoded"),  # an upstream decoding twice
    ("file:///public/%25252e%25252e/etc", "the dot-segment '..' once decoded"),  # ... or three times
    ("file:///public/..;/etc/passwd", "the dot-segment '..;', "),  # Tomcat drops `;...` from a segment
    ("file:///public/..;x=1/etc", "the dot-segment '..;x=1', "),
    ("file:///public/%2e%2e;x/etc", "the dot-segment '..;x' once decoded"),
    ("file:///public/..%3B/etc", "the dot-segment '..;' once decoded"),
    ("file:///public/.;jsessionid=1/x", "the dot-segment '.;jsessionid=1', "),
    ("file:///public/..%20/etc", "the dot-segment '.. ' once decoded"),  # white space trimmed
    ("file:///public/ ../etc", "the dot-segment ' ..', "),
    ("file:///public/.\u200b./etc", "the dot-segment '.\\u200b.', "),  # unseen characters left out
    ("file:///public/\uff0e\uff0e/etc", "the dot-segment '..' once decoded or normalised"),  # NFKC
    ("file:///public/%EF%BC%8E%EF%BC%8E/etc", "the dot-segment '..' once decoded or normalised"),
    ("file:///public/..?x", "the dot-segment '..', "),  # a segment ends at `?` and `#` too
    ("file:///public/..%3Fx", "the dot-segment '..' once decoded"),
    ("file:///public/x?q=/../y", "the dot-segment '..', "),  # in the query too
    # Separators an upstream may decode into a path, and backslashes.
    ("file:///public%2F..%2Fetc", "an encoded separator ('%2F'), "),
    ("file:///public%5c..%5cetc", "an encoded separator ('%5c'), "),
    ("file:///public%252F..%252Fetc", "an encoded separator ('%2F') once decoded"),
    ("file:///public%255C..%255Cetc", "an encoded separator ('%5C') once decoded"),
    ("file:///public\\..\\etc", "a backslash ('\\'), "),
    ("file:///public\uff3c..\uff3cetc", "a backslash ('\\') once decoded or normalised"),  # fullwidth
    # Control characters, which parsers drop (tab, newline) or cut a path at (NUL).
    ("file:///public/..%00/etc", "the control character U+0000 once decoded"),
    ("file:///public/%00", "the control character U+0000 once decoded"),
    ("file:///public/%2500", "the control character U+0000 once decoded"),
    ("file:///public/.\t./etc", "the control character U+0009, "),
    ("file:///public/x%0Ay", "the control character U+000A once decoded"),
    # Encoded bytes that are not UTF-8: an overlong `%C0%AE` is `.` to a lenient decoder.
    ("file:///public/%C0%AE%C0%AE/etc", "percent-encoded bytes that are not UTF-8 (%C0 %AE %C0 %AE)"),
    ("file:///public/%E9t%E9", "percent-encoded bytes that are not UTF-8 (%E9 %E9)"),
    ("file:///public/\ud800", "the lone surrogate U+D800, which is no character"),
    ("file:///" + "x" * 250, "it is 258 characters long, over the 256 Writ can record"),
]


@pytest.mark.parametrize(("uri", "problem"), URI_KINDS)
def test_each_kind_of_uri_is_asked_or_refused_as_any_reading_of_it_could_resolve(
    uri: str, problem: str | None
) -> None:
    found = uri_problem(uri)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found, found


def test_a_uri_is_checked_as_the_upstream_gets_it_without_its_prefix_too() -> None:
    # `lib+..` is no dot-segment, but the upstream gets `../x`.
    assert uri_problem("lib+../x", "") is None
    assert (
        uri_problem("lib+../x", "lib+")
        == "its path holds the dot-segment '..', which an upstream may resolve"
    )
    assert uri_problem("lib+%2e%2e/x", "lib+") is not None


# Each under `lib+note://*`, which readers may read: the pattern is matched as written, the upstream may
# resolve it (`note://x/../secret` is `note://secret`, which a narrower rule could have kept from them).
RESOLVABLE = [
    "lib+note://x/../secret",
    "lib+note://x/%2e%2e/secret",
    "lib+note://x/%2E%2E/secret",
    "lib+note://x/.%2e/secret",
    "lib+note://x/./secret",
    "lib+note://x/..?q",
    "lib+note://x%2f..%2fsecret",
    "lib+note://x%5C..%5Csecret",
    "lib+note://x\\..\\secret",
    "lib+note://x/%252e%252e/secret",
    "lib+note://x%252F..%252Fsecret",
    "lib+note://x/..;/secret",
    "lib+note://x/%2e%2e;x/secret",
    "lib+note://x/..%20/secret",
    "lib+note://x/..%00/secret",
    "lib+note://secret%00",
    "lib+note://x/%C0%AE%C0%AE/secret",
    "lib+note://x/\uff0e\uff0e/secret",
    "lib+note://" + "x" * 300,  # longer than the store records a read's URI
]
ASKED = ["lib+note://x..y/...", "lib+note://x/%2541", "lib+note://x/a;v=1", "lib+note://x/..b"]
"""Under `lib+note://*` too, and resolving nowhere else: asked of the upstream (which has none of them)."""


async def test_a_uri_an_upstream_could_resolve_to_another_is_invalid_and_neither_recorded_nor_sent(
    gateway: Writ,
) -> None:
    before = sum(READS.values())
    async with gateway.client(gateway.token("dots", roles="reader")) as client:
        with pytest.raises(MCPError) as first:
            await client.read_resource(RESOLVABLE[0])
        for uri in RESOLVABLE:
            with pytest.raises(MCPError) as invalid:
                await client.read_resource(uri)
            assert (invalid.value.code, invalid.value.data) == (INVALID_PARAMS, {"uri": uri}), uri
            assert invalid.value.message.startswith("Invalid resource URI, not read: "), uri
            assert invalid.value.message.endswith(f": {uri}"), uri
        for uri in ASKED:
            with pytest.raises(MCPError) as asked:
                await client.read_resource(uri)
            assert asked.value.code == -32002, uri
    assert "the dot-segment '..'" in first.value.message
    assert sum(READS.values()) == before + len(ASKED)
    assert [READS[f"lib:{uri.removeprefix('lib+')}"] for uri in ASKED] == [1] * len(ASKED)
    recorded = sorted(c.arguments["uri"] for c in gateway.recorded_calls() if c.subject == "dots")
    assert recorded == sorted(ASKED)


@pytest.mark.parametrize("mode", MODES)
async def test_a_read_or_get_answers_with_writs_meta_never_the_upstreams(gateway: Writ, mode: str) -> None:
    async with gateway.client(gateway.token(f"meta-{mode}", roles="reader"), mode=mode) as client:
        read = await client.read_resource("lib+note://forged")
    async with gateway.client(gateway.token(f"meta-{mode}", roles="agent"), mode=mode) as client:
        got = await client.get_prompt("lib_greet")
    calls = {c.capability_id: c for c in gateway.recorded_calls() if c.subject == f"meta-{mode}"}
    for answer, call in ((read, calls["lib/resources"]), (got, calls["lib/prompts/greet"])):
        meta = answer.meta or {}
        # As for a tool result: Writ's ids, and none of the upstream's keys, its own included.
        assert (meta["writ/toolCallId"], meta["writ/status"]) == (call.tool_call_id, "completed")
        assert "example.com/upstream" not in meta
        assert meta.get(SERVER_INFO_META_KEY, {}).get("version") != "forged"
        assert call.result is not None and "_meta" not in call.result["structuredContent"]
    assert _text(read) == [("lib+note://forged", "Forged.")]


@pytest.mark.parametrize("mode", MODES)
async def test_prompts_are_listed_by_their_shown_names_and_got_with_their_arguments(
    gateway: Writ, mode: str
) -> None:
    async with gateway.client(gateway.token("ann", roles="agent"), mode=mode) as client:
        prompts = {p.name: p for p in (await client.list_prompts()).prompts}
        lib = await client.get_prompt("lib_summarize", {"topic": "apples", "style": "terse"})
        box = await client.get_prompt("box_summary", {"topic": "pears"})
        with pytest.raises(MCPError) as hidden:
            await client.get_prompt("greet")  # box's, relayed unprefixed; no rule allows it
    assert set(prompts) == {"lib_summarize", "lib_greet", "box_summary"}
    arguments = prompts["lib_summarize"].arguments or []
    assert [(a.name, a.required, a.description) for a in arguments] == [
        ("topic", True, "What to summarize"),
        ("style", False, None),
    ]
    [message] = lib.messages
    assert isinstance(message.content, types.TextContent)
    # lib's `topic` is redacted: its echo is withheld from the record, and so from the answer, as a
    # tool result's is; box's is not.
    assert message.content.text == "[lib] Summarize [redacted:topic] in a terse style."
    assert box.messages[0].content == types.TextContent(
        type="text", text="[box] Summarize pears in a plain style."
    )
    assert hidden.value.code == REFUSED and hidden.value.data["reason"] == "no_matching_rule"


async def test_resources_a_prompt_embeds_or_links_are_named_as_writ_shows_them(gateway: Writ) -> None:
    async with gateway.client(gateway.token("ann", roles="agent")) as client:
        greeting = await client.get_prompt("lib_greet")
    _, embedded, linked = (m.content for m in greeting.messages)
    assert isinstance(embedded, types.EmbeddedResource) and isinstance(linked, types.ResourceLink)
    assert (embedded.resource.uri, linked.uri) == ("lib+note://welcome", "lib+note://secret")


async def test_a_prompt_rule_on_arguments_denies_or_holds_with_its_message_and_arguments_are_checked(
    gateway: Writ,
) -> None:
    async with gateway.client(gateway.token("ann", roles="agent")) as client:
        with pytest.raises(MCPError) as secret:
            await client.get_prompt("lib_summarize", {"topic": "secrets"})
        with pytest.raises(MCPError) as payroll:
            await client.get_prompt("box_summary", {"topic": "payroll"})
        with pytest.raises(MCPError) as missing:
            await client.get_prompt("lib_summarize", {"style": "terse"})
        with pytest.raises(MCPError) as unknown:
            await client.get_prompt("no_such_prompt")
    assert secret.value.data["reason"] == "secret_topic"
    assert (payroll.value.code, payroll.value.data["status"]) == (REFUSED, "approval_pending")
    assert payroll.value.data["message"] == "Payroll summaries wait for an approver."
    assert missing.value.code == types.INVALID_PARAMS and "topic" in missing.value.message
    assert unknown.value.code == types.INVALID_PARAMS


async def test_a_prompt_get_is_recorded_with_redacted_arguments_stored_as_hashes(recording: Writ) -> None:
    gateway = recording
    async with gateway.client(gateway.token("red", roles="agent")) as client:
        await client.get_prompt("lib_summarize", {"topic": "apricots"})
    [call] = [c for c in gateway.recorded_calls() if c.subject == "red"]
    assert (call.tool_name, call.capability_id, call.status) == (
        "lib_summarize",
        "lib/prompts/summarize",
        "completed",
    )
    assert str(call.arguments["topic"]).startswith("redacted:")
    assert "apricots" not in str(call.arguments)


@pytest.mark.parametrize("mode", MODES)
async def test_completions_are_asked_of_the_upstream_of_what_the_caller_may_get_or_read(
    gateway: Writ, mode: str
) -> None:
    async with gateway.client(gateway.token("ann", roles="agent"), mode=mode) as client:
        topics = await client.complete(
            types.PromptReference(name="box_summary"), {"name": "topic", "value": "ap"}
        )
        with pytest.raises(MCPError) as hidden:
            await client.complete(
                types.ResourceTemplateReference(uri="lib+note://{note}"), {"name": "note", "value": ""}
            )
    assert topics.completion.values == ["apples", "apricots"]
    assert hidden.value.code == types.INVALID_PARAMS
    async with gateway.client(gateway.token("rea", roles="reader"), mode=mode) as client:
        notes = await client.complete(
            types.ResourceTemplateReference(uri="lib+note://{note}"), {"name": "note", "value": "w"}
        )
    assert notes.completion.values == ["welcome"]


async def test_resources_prompts_and_completions_are_advertised_only_when_relayed(
    gateway: Writ, backend: Backend, tmp_path: Path
) -> None:
    async with gateway.client(gateway.token("ann", roles="agent"), mode="legacy") as client:
        relaying = client.server_capabilities
    assert relaying.resources is not None and relaying.prompts is not None
    assert relaying.completions is not None
    with writ(tmp_path, backend, f"sqlite:///{tmp_path / 'writ.db'}") as plain:
        async with plain.client(plain.token("ann", roles="agent"), mode="legacy") as client:
            capabilities = client.server_capabilities
            with pytest.raises(MCPError) as absent:
                await client.list_resources()
    assert (
        capabilities.resources is None and capabilities.prompts is None and capabilities.completions is None
    )
    assert absent.value.code == types.METHOD_NOT_FOUND


async def test_unknown_resources_and_prompts_are_security_events_of_their_kind(recording: Writ) -> None:
    gateway = recording
    async with gateway.client(gateway.token("probe", roles="agent")) as client:
        for uri in ("note://welcome", "file:///etc/passwd"):
            with pytest.raises(MCPError):
                await client.read_resource(uri)
        with pytest.raises(MCPError):
            await client.get_prompt("no_such_prompt")
        with pytest.raises(MCPError):  # a template this caller may not read: as unknown as a missing one
            await client.complete(
                types.ResourceTemplateReference(uri="lib+note://{note}"), {"name": "note", "value": ""}
            )
        with pytest.raises(MCPError):  # denied by policy, not unknown: the call's own record says so
            await client.read_resource("box+note://nothing-here")
    security = gateway.runtime.security
    assert isinstance(security, SecurityEvents)
    await security.tick(flush_all=True)

    def probed_for() -> list[dict[str, Any]]:
        found = gateway.runtime.store.export(EventFilter(types=("security.unknown_tool",)))
        return [e for e in found if e["payload"]["subject"] == "probe"]

    # The gateway's own pass may be writing some of them still.
    probed = await eventually(probed_for, lambda events: len(events) >= 4)
    assert sorted(
        (e["payload"]["kind"], e["payload"]["tool_name"], e["payload"]["count"]) for e in probed
    ) == [
        ("unknown_prompt", "no_such_prompt", 1),
        ("unknown_resource", "file:///etc/passwd", 1),
        ("unknown_resource", "lib+note://{note}", 1),
        ("unknown_resource", "note://welcome", 1),
    ]
    assert {e["tenant"] for e in probed} == {"acme"}
