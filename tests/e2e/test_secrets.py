"""No configured secret leaks, and no client token reaches a backend, on the whole gateway served in this
process (`inproc.writ`; the acme and echo backends and the authorization server are served here too, the
CLI run by its own `main`).

Every kind of secret is configured at once (a backend bearer token from env, a header token from a file,
a basic password, an OAuth client secret for client credentials and the tokens it yields, the
introspection client secret, the webhook signing secret, the dev issuer's private key); calls end in
every state (completed, failed, token endpoint down, result_unknown, approval_pending, denied); then the
audit export, every MCP result, the API, `writ calls show` and the gateway's DEBUG log (every record
logged in this process while the case runs, as caplog's text) are scanned.
"""

from __future__ import annotations

import base64
import json
import logging
import secrets
from collections.abc import Iterator
from pathlib import Path
from string import Template
from typing import Any

import anyio
import httpx2
import pytest
import uvicorn
import yaml

from tests.e2e import echo_backend
from tests.e2e.harness import REPO, Backend, Gateway, free_port
from tests.eventually import eventually
from tests.gateway.auth.oauth_process import AuthServer
from tests.gateway.auth.oauth_server import CLIENTS
from tests.gateway.mcp import inproc

pytestmark = pytest.mark.anyio

OBJECT = {"type": "object"}


class Echo:
    def __init__(self, url: str) -> None:
        self.url = url

    def seen(self) -> list[dict[str, Any]]:
        return httpx2.get(f"{self.url}/_seen", timeout=5).json()["requests"]


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[Backend]:
    with inproc.acme(tmp_path) as b:
        yield b


@pytest.fixture
def echo() -> Iterator[Echo]:
    """tests/e2e/echo_backend.py, served in this process."""
    port = free_port()
    config = uvicorn.Config(echo_backend.build_app(), host="127.0.0.1", port=port, log_level="warning")
    with inproc.serving(config):
        yield Echo(f"http://127.0.0.1:{port}")


@pytest.fixture
def oauth() -> Iterator[AuthServer]:
    with inproc.oauth("http://unused.example/mcp") as server:
        yield server


def echo_capability(id: str, backend: str, path: str, effect: str = "read") -> dict[str, Any]:
    method = "GET" if effect == "read" else "POST"
    return {
        "id": id,
        "tool": id,
        "backend": backend,
        "effect": effect,
        "input_schema": OBJECT,
        "request": {"method": method, "path": path},
    }


def overrides(backend: Backend, echo: Echo, oauth: AuthServer, token_file: Path) -> dict[str, Any]:
    template = Template((REPO / "demo" / "demo.yaml").read_text())
    demo = yaml.safe_load(template.safe_substitute(gateway_port=0, backend_port=0, state_dir="."))
    tools = ["record_note", "ledger_refused", "archive_ping", "file_ping"]
    return {
        "backends": {
            "acme": {
                "type": "http",
                "base_url": backend.url,
                "auth": {"type": "bearer", "token_env": "T_ACME_TOKEN"},
            },
            "ledger": {
                "type": "http",
                "base_url": echo.url,
                "auth": {
                    "type": "oauth2_client_credentials",
                    "token_url": f"{oauth.issuer}/token",
                    "client_id": "writ-backend",
                    "client_secret_env": "T_LEDGER_CLIENT_SECRET",
                    "scope": "ledger.write",
                    "resource": "https://ledger.internal",
                },
            },
            "archive": {
                "type": "http",
                "base_url": echo.url,
                "auth": {"type": "basic", "username": "writ", "password_env": "T_ARCHIVE_PASSWORD"},
            },
            "files": {
                "type": "http",
                "base_url": echo.url,
                "auth": {"type": "header", "header": "X-Api-Key", "token_file": str(token_file)},
            },
        },
        "capabilities": [
            *demo["capabilities"],
            echo_capability("record_note", "ledger", "/notes", effect="write"),
            echo_capability("ledger_refused", "ledger", "/unauthorized"),
            echo_capability("archive_ping", "archive", "/archive"),
            echo_capability("file_ping", "files", "/files"),
        ],
        "policy": {
            "rules": [
                *demo["policy"]["rules"],
                {"id": "agents-use-echo", "tools": tools, "roles": ["agent"], "decision": "allow"},
            ]
        },
        "approvals": {
            "poll_interval_s": 0.2,
            "webhook": {"url": f"{echo.url}/hooks/writ", "secret_env": "T_WEBHOOK_SECRET"},
        },
    }


class Calls:
    """Every MCP result as JSON, and the ids of calls and runs they name."""

    def __init__(self) -> None:
        self.results: list[str] = []
        self.call_ids: set[str] = set()
        self.run_ids: set[str] = set()

    async def call(self, gateway: Gateway, token: str, tool: str, args: dict[str, Any], **meta: Any) -> Any:
        async with gateway.client(token) as client:
            result = await client.call_tool(tool, args, meta=meta or None)
        self.results.append(result.model_dump_json(by_alias=True))
        structured = result.structured_content or {}
        for source in (result.meta or {}, structured):
            for key in ("writ/toolCallId", "toolCallId"):
                if isinstance(source.get(key), str):
                    self.call_ids.add(source[key])
            for key in ("writ/runId", "runId"):
                if isinstance(source.get(key), str):
                    self.run_ids.add(source[key])
        return result


def status(result: Any) -> str:
    return (result.meta or {}).get("writ/status") or result.structured_content["status"]


def basic(user: str, password: str) -> str:
    return base64.b64encode(f"{user}:{password}".encode()).decode()


async def test_no_configured_secret_reaches_results_events_api_cli_or_logs_and_no_client_token_a_backend(
    tmp_path: Path,
    backend: Backend,
    echo: Echo,
    oauth: AuthServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    acme_token, archive_password = secrets.token_hex(16), secrets.token_hex(16)
    file_token, webhook_secret = secrets.token_hex(16), secrets.token_hex(16)
    token_file = tmp_path / "files.token"
    token_file.write_text(file_token + "\n")
    monkeypatch.setenv("T_ACME_TOKEN", acme_token)
    monkeypatch.setenv("T_ARCHIVE_PASSWORD", archive_password)
    monkeypatch.setenv("T_WEBHOOK_SECRET", webhook_secret)
    monkeypatch.setenv("T_LEDGER_CLIENT_SECRET", CLIENTS["writ-backend"]["secret"])
    monkeypatch.setenv("T_INTROSPECT_SECRET", CLIENTS["writ-introspect"]["secret"])
    monkeypatch.setenv("WRIT_LOG_LEVEL", "DEBUG")  # for the CLI's runs; the gateway's is caplog's level
    caplog.set_level(logging.DEBUG)
    auth = {
        "issuers": [
            {
                "issuer": oauth.issuer,
                "introspection": {"client_id": "writ-introspect", "client_secret_env": "T_INTROSPECT_SECRET"},
            }
        ]
    }
    config = overrides(backend, echo, oauth, token_file)
    store = f"sqlite:///{tmp_path / 'writ.db'}"
    calls = Calls()
    with (
        inproc.writ(tmp_path, backend, store, auth=auth, overrides=config) as gateway,
        anyio.fail_after(120),
    ):
        dev_token = gateway.token("alice", roles="agent")
        jwt_token = oauth.token("agent-rs", resource=gateway.mcp_url)
        opaque_token = oauth.token("agent-opaque", resource=gateway.mcp_url)
        client_tokens = [dev_token, jwt_token, opaque_token]
        refund = {"order_id": "1001", "currency": "EUR", "reason": "damaged in transit"}

        assert status(await calls.call(gateway, dev_token, "refund_order", {**refund, "amount": 20})) == (
            "completed"
        )
        assert status(await calls.call(gateway, jwt_token, "lookup_order", {"order_id": "1001"})) == (
            "completed"
        )
        missing = await calls.call(gateway, opaque_token, "lookup_order", {"order_id": "no-such-order"})
        assert missing.is_error
        pending = await calls.call(
            gateway, dev_token, "refund_order", {**refund, "amount": 250}, **{"writ/runId": "secrets"}
        )
        assert status(pending) == "approval_pending"
        denied = await calls.call(gateway, jwt_token, "refund_order", {**refund, "amount": 20000})
        assert status(denied) == "denied"
        backend.chaos(drop_responses=1)
        unknown = await calls.call(gateway, dev_token, "refund_order", {**refund, "amount": 30})
        assert status(unknown) == "result_unknown"

        for token in client_tokens:
            assert status(await calls.call(gateway, token, "record_note", {"text": "hi"})) == "completed"
        assert status(await calls.call(gateway, dev_token, "archive_ping", {})) == "completed"
        assert status(await calls.call(gateway, opaque_token, "file_ping", {})) == "completed"
        # The ledger refuses the token (401): Writ drops it; with the token endpoint down, the next
        # call fails before anything is sent, and the failure names no secret.
        assert (await calls.call(gateway, dev_token, "ledger_refused", {})).is_error
        oauth.set_token_endpoint(503)
        sent_before = len(echo.seen())
        down = await calls.call(gateway, dev_token, "record_note", {"text": "lost"})
        assert down.is_error and "backend_unreachable" in down.model_dump_json()
        assert len(echo.seen()) == sent_before
        oauth.set_token_endpoint(200)

        await eventually(
            lambda: any(r["path"] == "/hooks/writ" for r in echo.seen())
        )  # the approval's webhook
        seen = echo.seen()
        auditor = gateway.token("audra", roles="auditor,approver")
        api = httpx2.Client(base_url=gateway.url, headers={"Authorization": f"Bearer {auditor}"}, timeout=10)
        with api:
            answers = [api.get("/api/approvals").text]
            answers += [api.get(f"/api/calls/{call_id}").text for call_id in calls.call_ids]
            answers += [api.get(f"/api/runs/{run_id}/events").text for run_id in calls.run_ids]
        assert all(answer.startswith(("{", "[")) for answer in answers)
        shown = [gateway.cli("calls", "show", call_id).stdout for call_id in sorted(calls.call_ids)]
        export = gateway.cli("audit", "export").stdout

    # The gateway's log: every record but those of the servers beside it in this process (the
    # authorization server logs the client secrets it checks; a process of its own did so elsewhere).
    beside = {f"uvicorn:{url.rsplit(':', 1)[1]}" for url in (backend.url, echo.url, oauth.issuer)}
    records = [r for r in caplog.records if r.threadName not in beside]
    log = "\n".join(caplog.handler.format(r) for r in records)
    assert {"DEBUG", "INFO"} <= {r.levelname for r in records}
    assert any(r.name.startswith("gateway.") for r in records)

    issued = {r["headers"]["authorization"].removeprefix("Bearer ") for r in seen if r["path"] == "/notes"}
    assert len(issued) == 1  # one token served the three record_note calls
    dev_key = json.loads((tmp_path / "dev-issuer.jwk").read_text())
    configured = {
        "backend bearer token": acme_token,
        "backend header token file": file_token,
        "basic password": archive_password,
        "basic credentials": basic("writ", archive_password),
        "client credentials secret": CLIENTS["writ-backend"]["secret"],
        "introspection client secret": CLIENTS["writ-introspect"]["secret"],
        "webhook secret": webhook_secret,
        "dev issuer private key": dev_key["d"],
        **{f"backend access token {n}": token for n, token in enumerate(issued)},
    }
    places = {
        "audit export": export,
        "MCP results": "\n".join(calls.results),
        "API answers": "\n".join(answers),
        "writ calls show": "\n".join(shown),
        "gateway log": log,
    }
    assert len(calls.call_ids) >= 10 and calls.run_ids and export.count("\n") > 20
    leaks = [
        (what, where) for what, value in configured.items() for where, text in places.items() if value in text
    ]
    assert leaks == []
    client_leaks = [where for token in client_tokens for where, text in places.items() if token in text]
    assert client_leaks == []

    # Backends get their own credentials and never a client's token.
    assert {r["headers"].get("x-api-key") for r in seen if r["path"] == "/files"} == {file_token}
    assert {r["headers"].get("authorization") for r in seen if r["path"] == "/archive"} == {
        f"Basic {basic('writ', archive_password)}"
    }
    received = json.dumps(seen)
    assert [token for token in client_tokens if token in received] == []
