"""Security events from the real gateway, in process (`gateway/mcp/inproc.py`), on both stores: a flood
of bad tokens makes a bounded number of `security.auth_failed` events whose counts add up to the flood,
naming the subject only of tokens the issuer signed and never a token; the official MCP client calling a
tool that does not exist makes `security.unknown_tool`; refusals at the edge (a body over the limit, an
Origin this gateway does not serve) make `security.edge_refused`. The log still verifies, and an auditor
reads them over HTTP, in OCSF too. The window is an hour here: a key's first refusal is written by the
gateway's next pass, the rest of it by the pass a case asks for (`flush`, as the gateway writes them on
the way out), so a case expects one or two events a key and counts that add up."""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp.shared.exceptions import MCPError

from gateway.audit.security import SecurityEvents
from gateway.console.routes import SESSION_COOKIE
from store import EventFilter
from tests.eventually import eventually_sync
from tests.gateway.mcp.inproc import Writ, acme, writ
from tests.postgres import fresh_schema

HOUR_WINDOW = {"security_events": {"window_s": 3600}}
THROTTLED = {"tenants": {"throttled": {"per_s": 0.001, "burst": 2}}}
"""A tenant whose principals get two calls, then wait a quarter of an hour; the others are as usual."""
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
LIST_TOOLS = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def gateway(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Writ]:
    workdir: Path = tmp_path_factory.mktemp("writ")
    with contextlib.ExitStack() as stack:
        if request.param == "sqlite":
            url = f"sqlite:///{workdir / 'writ.db'}"
        else:
            url = stack.enter_context(fresh_schema(request.getfixturevalue("postgres_url")))
        backend = stack.enter_context(acme(workdir))
        overrides = {"audit": HOUR_WINDOW, "rate_limits": THROTTLED}
        yield stack.enter_context(writ(workdir, backend, url, overrides=overrides))


def flush(gateway: Writ) -> None:
    """Write what the gateway counted so far, as its background pass does once a window has passed."""
    security = gateway.runtime.security
    assert isinstance(security, SecurityEvents)
    anyio.run(lambda: security.tick(flush_all=True))


def security_events(gateway: Writ, event_type: str, **payload: Any) -> list[dict[str, Any]]:
    found = gateway.runtime.store.export(EventFilter(types=(event_type,)))
    return [e for e in found if all(e["payload"].get(k) == v for k, v in payload.items())]


def written(gateway: Writ, event_type: str, total: int, **payload: Any) -> list[dict[str, Any]]:
    """The events of `event_type` whose payload says `payload`, once what was counted is written and
    their counts add up to `total`: the gateway's own pass may have taken some of the refusals an
    instant before `flush` and be writing them still, in an event of their own."""
    flush(gateway)
    return eventually_sync(
        lambda: security_events(gateway, event_type, **payload),
        lambda found: sum(e["payload"]["count"] for e in found) >= total,
    )


def mint(gateway: Writ, subject: str, **claims: Any) -> str:
    config, issuer = gateway.issuing()
    assert issuer is not None
    given: dict[str, Any] = {"audience": config.server.resource_url, "tenant": "acme", "roles": ["agent"]}
    given.update(claims)
    return issuer.mint(subject=subject, **given)


def list_tools(gateway: Writ, token: str, **headers: str) -> httpx2.Response:
    sent = {**MCP_HEADERS, "Authorization": f"Bearer {token}", **headers}
    return httpx2.post(gateway.mcp_url, json=LIST_TOOLS, headers=sent, timeout=10)


def test_a_flood_of_bad_tokens_makes_a_few_events_that_count_it(
    gateway: Writ, caplog: pytest.LogCaptureFixture
) -> None:
    expired = mint(gateway, "flooder", now=time.time() - 7200, ttl_s=60)
    elsewhere = mint(gateway, "flooder", audience="https://other.example/mcp")
    good = mint(gateway, "forger")
    forged = good[:-8] + ("A" * 8 if not good.endswith("A" * 8) else "B" * 8)
    flood = {"expired": (expired, 150), "wrong_audience": (elsewhere, 60), "bad_signature": (forged, 90)}
    before = {kind: security_events(gateway, "security.auth_failed", kind=kind) for kind in flood}

    heard: dict[str, set[str]] = {}
    with httpx2.Client(timeout=10) as http:
        for kind, (token, times) in flood.items():
            for _ in range(times):
                answer = http.post(
                    gateway.mcp_url,
                    json=LIST_TOOLS,
                    headers={**MCP_HEADERS, "Authorization": f"Bearer {token}"},
                )
                assert answer.status_code == 401
                heard.setdefault(kind, set()).add(answer.json()["error_description"])
    with caplog.at_level(logging.WARNING, logger="gateway.audit.security"):
        flush(gateway)

    assert heard == {
        "expired": {"the token has expired"},
        "wrong_audience": {"the token is for another resource (aud)"},
        "bad_signature": {"the token's signature does not verify"},
    }
    issuer = gateway.issuing()[1]
    assert issuer is not None
    for kind, (token, times) in flood.items():
        new = [
            e for e in security_events(gateway, "security.auth_failed", kind=kind) if e not in before[kind]
        ]
        # At most one event a window after the first: 300 refusals are two events a kind at most.
        assert 1 <= len(new) <= 2, new
        assert sum(e["payload"]["count"] for e in new) == times
        assert {e["payload"]["source"] for e in new} == {"127.0.0.1"}
        signed = kind != "bad_signature"  # the issuer vouches for who an expired or misdirected token names
        assert {e["payload"]["subject"] for e in new} == ({"flooder"} if signed else {None})
        assert {e["payload"]["issuer"] for e in new} == ({issuer.issuer} if signed else {None})
        assert {e["tenant"] for e in new} == ({"acme"} if signed else {None})
        assert token not in str(new) and token.split(".")[2] not in str(new)
    assert any("security.auth_failed kind=expired" in r.getMessage() for r in caplog.records)
    verified = gateway.cli("audit", "verify", check=False)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    ocsf = gateway.cli("audit", "export", "--format", "ocsf", "--type", "security.auth_failed")
    logons = [json.loads(line) for line in ocsf.stdout.splitlines()]
    assert {(e["class_uid"], e["activity_id"], e["status"]) for e in logons} == {(3002, 1, "Failure")}
    assert {e["status_detail"] for e in logons} >= set(flood)


@pytest.mark.anyio
async def test_the_official_client_calling_an_unknown_tool_is_a_security_event(gateway: Writ) -> None:
    async with gateway.client(gateway.token("curious-agent")) as client:
        with pytest.raises(MCPError, match="Unknown tool"):
            await client.call_tool("drop_database\x00", {"really": True})
        with pytest.raises(MCPError, match="Unknown tool"):
            await client.call_tool("drop_database\x00", {})
    await anyio.to_thread.run_sync(lambda: flush(gateway))

    # One event, or two when the gateway's own pass ran between the calls: the first one's window.
    events = security_events(gateway, "security.unknown_tool", subject="curious-agent")
    assert 1 <= len(events) <= 2 and sum(e["payload"]["count"] for e in events) == 2
    assert {(e["tenant"], e["payload"]["tool_name"]) for e in events} == {("acme", "drop_database?")}
    assert "really" not in str(events)
    event = events[-1]

    auditor = gateway.token("audrey", roles="auditor", tenant="acme")
    headers = {"Authorization": f"Bearer {auditor}"}
    params = {"type": "security.unknown_tool", "format": "ocsf"}
    async with httpx2.AsyncClient(timeout=10) as http:
        page = (await http.get(f"{gateway.url}/api/audit/events", params=params, headers=headers)).json()
    (ocsf,) = [e for e in page["events"] if e["unmapped"]["writ"]["event_id"] == event["event_id"]]
    assert (ocsf["class_uid"], ocsf["status"], ocsf["count"]) == (6003, "Failure", event["payload"]["count"])
    assert ocsf["api"]["operation"] == "tools/call drop_database?"


def test_refusals_at_the_edge_are_security_events(gateway: Writ) -> None:
    token = gateway.token("edgy-agent")
    big = httpx2.post(
        f"{gateway.url}/api/approvals/ap-none/decision",
        content=b"x" * (2 * 1024 * 1024),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        timeout=10,
    )
    foreign = list_tools(gateway, token, Origin="https://evil.example")
    flush(gateway)

    assert big.status_code == 413 and foreign.status_code == 403
    (too_large,) = security_events(gateway, "security.edge_refused", kind="request_too_large")
    assert too_large["payload"]["path"] == "/api/approvals/ap-none/decision"
    assert too_large["payload"]["source"] == "127.0.0.1"
    (origin,) = security_events(gateway, "security.edge_refused", kind="bad_origin")
    assert origin["payload"]["path"] == "/mcp"
    assert token not in str(too_large) + str(origin)


def test_a_scope_refusal_is_not_an_edge_refusal(gateway: Writ) -> None:
    before = security_events(gateway, "security.edge_refused")
    answer = httpx2.get(
        f"{gateway.url}/api/audit/events", headers={"Authorization": f"Bearer {gateway.token('agent-x')}"}
    )
    flush(gateway)

    assert answer.status_code == 403
    assert security_events(gateway, "security.edge_refused") == before


@pytest.mark.anyio
async def test_calls_over_the_rate_limit_are_counted_as_edge_refusals_of_their_principal(
    gateway: Writ,
) -> None:
    async with gateway.client(gateway.token("hasty-agent", tenant="throttled")) as client:
        heard = [
            (await client.call_tool("lookup_order", {"order_id": "1001"})).structured_content or {}
            for _ in range(5)
        ]
    await anyio.to_thread.run_sync(lambda: flush(gateway))

    assert [h.get("reason") for h in heard][2:] == ["rate_limited"] * 3
    events = security_events(gateway, "security.edge_refused", kind="rate_limited", subject="hasty-agent")
    assert 1 <= len(events) <= 2 and sum(e["payload"]["count"] for e in events) == 3
    assert {e["tenant"] for e in events} == {"throttled"}


def test_bad_tokens_at_the_console_are_failed_authentications_on_its_paths(
    gateway: Writ, monkeypatch: pytest.MonkeyPatch
) -> None:
    counted: list[str] = []  # what `writ.auth.failures` is given, by kind
    monkeypatch.setattr(gateway.runtime.telemetry, "authentication_failed", counted.append)
    expired = mint(gateway, "console-user", now=time.time() - 7200, ttl_s=60)
    good = mint(gateway, "console-user", roles=["approver"])
    forged = good[:-8] + ("A" * 8 if not good.endswith("A" * 8) else "B" * 8)
    console = "/console/login"

    with httpx2.Client(base_url=gateway.url, timeout=10) as browser:
        pasted = browser.post(console, data={"token": f"Bearer {expired}"})
        nothing = browser.post(console, data={"token": ""})
        pasted_forged = browser.post(console, data={"token": forged})
    # The cookie holds a session id, never a token: a bearer token in it (as it was before sessions,
    # even a good one) names no session and opens nothing. Nor is it a failed authentication: a
    # cookie naming no session is what a browser keeps after logging out.
    for cookie in (good, forged):
        with httpx2.Client(base_url=gateway.url, timeout=10, cookies={SESSION_COOKIE: cookie}) as browser:
            page = browser.get("/console/inbox")
        assert page.status_code == 303 and page.headers["location"] == "/console/login"

    assert (pasted.status_code, nothing.status_code, pasted_forged.status_code) == (401, 401, 401)
    assert counted == ["expired", "bad_signature"]
    issuer = gateway.issuing()[1]
    assert issuer is not None
    (login,) = written(gateway, "security.auth_failed", 1, kind="expired", path=console)
    # The issuer signed it: it names who, in its tenant's export; an empty form is not recorded.
    assert (login["payload"]["subject"], login["payload"]["issuer"]) == ("console-user", issuer.issuer)
    assert login["tenant"] == "acme" and login["payload"]["count"] == 1
    assert login["payload"]["source"] == "127.0.0.1"
    (bad,) = written(gateway, "security.auth_failed", 1, kind="bad_signature", path=console)
    # A forged token names no one: a forger's claims are not taken.
    assert bad["payload"]["subject"] is None and bad["tenant"] is None
    assert bad["payload"]["source"] == "127.0.0.1"
    assert not security_events(gateway, "security.auth_failed", path="/console/inbox")
    for token in (expired, forged, good):
        assert token.split(".")[2] not in str([login, bad])


def test_a_revoked_principal_logging_in_at_the_console_is_recorded(gateway: Writ) -> None:
    root = gateway.token("root", roles="admin")
    gateway.cli(
        "principals", "revoke", "gone-approver", "--tenant", "acme", "--reason", "left", "--token", root
    )
    token = mint(gateway, "gone-approver", roles=["approver"])

    with httpx2.Client(base_url=gateway.url, timeout=10) as browser:
        refused = browser.post("/console/login", data={"token": token})

    assert refused.status_code == 403
    (event,) = written(gateway, "security.auth_failed", 1, kind="principal_revoked")
    assert (event["tenant"], event["payload"]["subject"]) == ("acme", "gone-approver")
    assert event["payload"]["path"] == "/console/login" and event["payload"]["source"] == "127.0.0.1"
    assert token.split(".")[2] not in str(event)
