"""Refusals at Writ's own authorization server recorded as `security.oauth_refused`, from the real
gateway in process on both stores: a replayed code, a reused refresh token, a PKCE verifier that does
not match, an unknown client or a wrong secret at /token and at /authorize, a redirect URI the client
did not register or another than its code's, a refused client metadata document, a grant revoked by an
admin still in use. Each names its kind, the client id, the client's address and (where a grant was
touched) its tenant; none holds a code, token, verifier or secret; they verify clean and map to OCSF.
The window is an hour: `flush` writes what was counted, as the gateway does on its way out."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from typer.testing import CliRunner

from gateway.audit.ocsf import ocsf_event
from gateway.audit.security import SecurityEvents
from gateway.cli.main import app
from store import EventFilter
from tests.eventually import eventually_sync
from tests.gateway.mcp.inproc import Writ, acme, writ
from tests.gateway.oauth.flow import (
    REDIRECT,
    Pkce,
    authorization_params,
    code_for,
    exchange,
    refresh,
    register,
)
from tests.gateway.oauth.test_documents import authorization_server
from tests.postgres import fresh_schema

KIND_OF = "security.oauth_refused"


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def gateway(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Writ]:
    workdir: Path = tmp_path_factory.mktemp("writ")
    with contextlib.ExitStack() as stack:
        if request.param == "sqlite":
            url = f"sqlite:///{workdir / 'writ.db'}"
        else:
            url = stack.enter_context(fresh_schema(request.getfixturevalue("postgres_url"), "writ_oauth_sec"))
        backend = stack.enter_context(acme(workdir))
        # Documents accepted, private addresses refused (the default): a loopback document URL is fenced off.
        auth = authorization_server(workdir, enabled=True)
        overrides = {"audit": {"security_events": {"window_s": 3600}}}
        yield stack.enter_context(writ(workdir, backend, url, auth=auth, overrides=overrides))


@pytest.fixture(scope="module")
def client_id(gateway: Writ) -> str:
    return str(register(gateway.url)["client_id"])


def refusals(gateway: Writ, kind: str, total: int = 0, **payload: Any) -> list[dict[str, Any]]:
    """The `security.oauth_refused` events of `kind` (and `payload`), once what was counted so far is
    written and their counts add up to `total`: the gateway's own pass may have taken some refusals an
    instant before `flush` and be writing them still, in an event of their own."""
    security = gateway.runtime.security
    assert isinstance(security, SecurityEvents)
    anyio.run(lambda: security.tick(flush_all=True))

    def found() -> list[dict[str, Any]]:
        events = gateway.runtime.store.export(EventFilter(types=(KIND_OF,)))
        wanted = {"kind": kind, **payload}
        return [e for e in events if all(e["payload"].get(k) == v for k, v in wanted.items())]

    return eventually_sync(found, lambda events: sum(e["payload"]["count"] for e in events) >= total)


def count(events: list[dict[str, Any]]) -> int:
    return sum(int(e["payload"]["count"]) for e in events)


def holds_none_of(events: list[dict[str, Any]], *secrets: str) -> None:
    text = json.dumps(events)
    for secret in secrets:
        assert secret not in text


def test_a_replayed_code_is_recorded_with_its_client_and_tenant(gateway: Writ, client_id: str) -> None:
    pkce = Pkce.make()
    code = code_for(gateway.url, client_id, pkce)
    first = exchange(gateway.url, client_id, code, pkce.verifier)
    assert first.status_code == 200 and refusals(gateway, "code_replayed") == []

    assert exchange(gateway.url, client_id, code, pkce.verifier).json()["error"] == "invalid_grant"

    (event,) = refusals(gateway, "code_replayed", 1)
    payload = event["payload"]
    assert (payload["client_id"], payload["source"], payload["count"]) == (client_id, "127.0.0.1", 1)
    assert event["tenant"] == "acme"  # the tenant of the grant it revoked: in acme's export
    holds_none_of([event], code, pkce.verifier, first.json()["access_token"], first.json()["refresh_token"])
    # Its tokens were revoked, and refreshing with them now is a grant revoked, still in use.
    assert refresh(gateway.url, client_id, first.json()["refresh_token"]).status_code == 400
    revoked = refusals(gateway, "grant_revoked", 1, client_id=client_id)
    assert count(revoked) == 1 and {e["tenant"] for e in revoked} == {"acme"}


def test_a_reused_refresh_token_is_recorded(gateway: Writ, client_id: str) -> None:
    pkce = Pkce.make()
    first = exchange(gateway.url, client_id, code_for(gateway.url, client_id, pkce), pkce.verifier).json()
    assert refresh(gateway.url, client_id, first["refresh_token"]).status_code == 200
    assert refusals(gateway, "refresh_reused") == []

    assert refresh(gateway.url, client_id, first["refresh_token"]).json()["error"] == "invalid_grant"

    (event,) = refusals(gateway, "refresh_reused", 1)
    assert event["payload"]["client_id"] == client_id and event["tenant"] == "acme"
    holds_none_of([event], first["refresh_token"])


def test_a_missing_or_wrong_pkce_verifier_is_recorded_and_uses_nothing_up(
    gateway: Writ, client_id: str
) -> None:
    pkce = Pkce.make()
    code = code_for(gateway.url, client_id, pkce)
    wrong = Pkce.make().verifier
    assert exchange(gateway.url, client_id, code, wrong).json()["error"] == "invalid_grant"
    assert exchange(gateway.url, client_id, code, None).json()["error"] == "invalid_request"

    events = refusals(gateway, "pkce_mismatch", 2)
    assert count(events) == 2 and {e["payload"]["client_id"] for e in events} == {client_id}
    assert {e["tenant"] for e in events} == {"acme"}
    holds_none_of(events, code, wrong)
    assert exchange(gateway.url, client_id, code, pkce.verifier).status_code == 200


def test_an_unknown_client_or_a_wrong_secret_is_recorded_as_invalid_client(gateway: Writ) -> None:
    data = {"grant_type": "authorization_code", "code": "guess", "redirect_uri": REDIRECT}
    unknown = httpx2.post(f"{gateway.url}/token", data=data | {"client_id": "nobody-here"}, timeout=10)
    assert unknown.json()["error"] == "invalid_client"
    confidential = httpx2.post(
        f"{gateway.url}/register",
        json={"redirect_uris": [REDIRECT], "grant_types": ["authorization_code", "refresh_token"]},
        timeout=10,
    ).json()
    wrong = httpx2.post(
        f"{gateway.url}/token", data=data, auth=(confidential["client_id"], "not-the-secret"), timeout=10
    )
    assert wrong.status_code == 401 and wrong.json()["error"] == "invalid_client"
    page = httpx2.get(
        f"{gateway.url}/authorize", params=authorization_params("ghost-client", Pkce.make()), timeout=10
    )
    assert page.status_code == 400

    events = refusals(gateway, "invalid_client", 3)
    by_client = {e["payload"]["client_id"]: e["payload"]["count"] for e in events}
    assert by_client == {"nobody-here": 1, confidential["client_id"]: 1, "ghost-client": 1}
    holds_none_of(events, "not-the-secret", confidential["client_secret"])


def test_a_redirect_uri_the_client_did_not_register_is_recorded_with_its_host(
    gateway: Writ, client_id: str
) -> None:
    params = authorization_params(client_id, Pkce.make(), redirect_uri="https://evil.example/cb?x=1")
    assert httpx2.get(f"{gateway.url}/authorize", params=params, timeout=10).status_code == 400
    pkce = Pkce.make()
    code = code_for(gateway.url, client_id, pkce)
    other = "http://127.0.0.1:47123/elsewhere"
    assert exchange(gateway.url, client_id, code, pkce.verifier, redirect_uri=other).status_code == 400

    events = refusals(gateway, "redirect_mismatch", 2)
    hosts = sorted(
        (e["payload"]["redirect_host"], e["tenant"])
        for e in events
        if e["payload"]["redirect_host"] != "ocsf.example"  # the OCSF case's, when it ran first
    )
    assert hosts == [("127.0.0.1", "acme"), ("evil.example", None)]
    assert all(e["payload"]["client_id"] == client_id for e in events)
    assert "/cb" not in json.dumps(events) and "elsewhere" not in json.dumps(events)


def test_a_document_refused_by_the_fence_is_recorded_with_its_url(gateway: Writ) -> None:
    url = "https://127.0.0.1:9/client.json"  # a loopback address: never fetched
    page = httpx2.get(f"{gateway.url}/authorize", params=authorization_params(url, Pkce.make()), timeout=10)
    assert page.status_code == 400 and "invalid_client" in page.text

    (event,) = refusals(gateway, "document_refused", 1)
    assert event["payload"]["client_id"] == url and event["payload"]["source"] == "127.0.0.1"
    assert [e for e in refusals(gateway, "invalid_client") if e["payload"]["client_id"] == url] == []


def test_a_grant_an_admin_revoked_still_in_use_is_recorded(gateway: Writ) -> None:
    client = str(register(gateway.url)["client_id"])
    pkce = Pkce.make()
    tokens = exchange(gateway.url, client, code_for(gateway.url, client, pkce), pkce.verifier).json()
    revoke = ["oauth", "clients", "revoke", client, "--tenant", "acme", "--break-glass", "--reason", "leak"]
    result = CliRunner().invoke(app, [*revoke, "--config", str(gateway.config)])
    assert result.exit_code == 0, result.output
    assert refresh(gateway.url, client, tokens["refresh_token"]).json()["error"] == "invalid_grant"

    events = refusals(gateway, "grant_revoked", 1, client_id=client)
    assert [(e["tenant"], e["payload"]["count"]) for e in events] == [("acme", 1)]


def test_they_verify_clean_and_are_failed_logons_in_ocsf(gateway: Writ, client_id: str) -> None:
    params = authorization_params(client_id, Pkce.make(), redirect_uri="https://ocsf.example/cb")
    httpx2.get(f"{gateway.url}/authorize", params=params, timeout=10)
    (event,) = refusals(gateway, "redirect_mismatch", 1, redirect_host="ocsf.example")

    ocsf = ocsf_event(event)

    assert (ocsf["class_uid"], ocsf["activity_id"], ocsf["status"]) == (3002, 1, "Failure")
    assert ocsf["status_detail"] == "redirect_mismatch"
    assert ocsf["user"] == {"uid": client_id, "type_id": 99, "type": "OAuth client"}
    assert ocsf["dst_endpoint"] == {"hostname": "ocsf.example"}
    report = gateway.runtime.store.verify()
    assert report.ok and report.grammar_violation is None, report
