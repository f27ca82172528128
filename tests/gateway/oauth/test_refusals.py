"""What Writ's authorization server refuses, each step on its own, in plain HTTP against the real
gateway in-process (`inproc.py`): redirect mismatches, PKCE, replays, other resources, expired codes,
refresh token reuse, registrations; and that its tokens are taken at /mcp only for this resource."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import httpx2
import pytest
from typer.testing import CliRunner

from gateway.cli.main import app
from store.commands import RevokePrincipal
from store.oauth import Grantee, digest
from tests.gateway.mcp.inproc import Writ, acme, writ
from tests.gateway.oauth.flow import (
    REDIRECT,
    Pkce,
    authorization_params,
    code_for,
    code_grant,
    csrf_of,
    exchange,
    redirected,
    refresh,
    register,
    sign_in,
    tools_list,
)
from tests.postgres import module_store_url

pytestmark = pytest.mark.anyio


store_url = module_store_url("writ_oauth")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, store_url: str) -> Iterator[Writ]:
    with acme(tmp_path_factory.mktemp("acme")) as backend:
        workdir: Path = tmp_path_factory.mktemp("writ")
        with writ(workdir, backend, store_url) as g:
            yield g


@pytest.fixture(scope="module")
def client_id(gateway: Writ) -> str:
    """One public client for the module's cases (registrations are rate-limited per address)."""
    return str(register(gateway.url)["client_id"])


ENDPOINTS = ("authorization_endpoint", "token_endpoint", "revocation_endpoint", "registration_endpoint")


def error_of(response: httpx2.Response, status: int = 400) -> str:
    assert response.status_code == status, response.text
    return str(response.json()["error"])


async def test_a_signed_in_token_is_taken_at_mcp_as_the_chosen_user(gateway: Writ, client_id: str) -> None:
    pkce = Pkce.make()
    code = code_for(gateway.url, client_id, pkce, resource=gateway.mcp_url)
    token = exchange(gateway.url, client_id, code, pkce.verifier, resource=gateway.mcp_url).json()
    assert token["token_type"] == "Bearer" and token["expires_in"] == 900 and token["refresh_token"]
    async with gateway.client(token["access_token"]) as mcp:
        names = {tool.name for tool in (await mcp.list_tools()).tools}
        result = await mcp.call_tool("lookup_order", {"order_id": "1001"})
    assert {"lookup_order", "refund_order"} <= names
    assert result.is_error is False
    call = gateway.runtime.store.get_call(result.meta["writ/toolCallId"])
    assert call is not None and (call.tenant, call.subject) == ("acme", "demo-agent")


def test_a_token_signed_by_the_server_for_another_audience_is_refused_at_mcp(gateway: Writ) -> None:
    server = gateway.runtime.authorization_server
    assert server is not None
    now = int(time.time())
    claims = {
        "iss": server.settings.issuer,
        "sub": "demo-agent",
        "tenant": "acme",
        "roles": ["agent"],
        "iat": now,
        "exp": now + 300,
        "client_id": "someone",
        "sid": "no-such-sign-in",
    }
    assert (
        tools_list(
            gateway.mcp_url, server.keys.sign(claims | {"aud": "https://other.example/mcp"})
        ).status_code
        == 401
    )


def test_a_redirect_uri_other_than_the_registered_one_is_refused_on_a_page_not_redirected(
    gateway: Writ, client_id: str
) -> None:
    params = authorization_params(client_id, Pkce.make(), redirect_uri="https://evil.example/cb")
    response = httpx2.get(f"{gateway.url}/authorize", params=params, timeout=10)
    assert response.status_code == 400 and "location" not in response.headers
    assert "Redirect URI https://evil.example/cb is not supported" in response.text


def test_a_redirect_uri_at_token_other_than_the_one_authorized_is_refused(
    gateway: Writ, client_id: str
) -> None:
    pkce = Pkce.make()
    code = code_for(gateway.url, client_id, pkce)
    other = "http://127.0.0.1:47123/elsewhere"
    assert (
        error_of(exchange(gateway.url, client_id, code, pkce.verifier, redirect_uri=other)) == "invalid_grant"
    )
    # The refusal used nothing up: the right request still gets its tokens.
    assert exchange(gateway.url, client_id, code, pkce.verifier).status_code == 200


def test_an_authorization_request_without_pkce_goes_back_to_the_client_as_invalid_request(
    gateway: Writ, client_id: str
) -> None:
    response = httpx2.get(
        f"{gateway.url}/authorize", params=authorization_params(client_id, None), timeout=10
    )
    back = redirected(response)
    assert back["error"] == "invalid_request" and back["state"] == "st-1"
    assert back["iss"] == gateway.runtime.authorization_server.settings.issuer  # type: ignore[union-attr]


def test_the_plain_pkce_method_is_refused(gateway: Writ, client_id: str) -> None:
    pkce = Pkce.make()
    params = authorization_params(
        client_id, pkce, code_challenge=pkce.verifier, code_challenge_method="plain"
    )
    back = redirected(httpx2.get(f"{gateway.url}/authorize", params=params, timeout=10))
    assert back["error"] == "invalid_request" and "S256" in back["error_description"]


def test_a_code_without_its_verifier_gets_no_token(gateway: Writ, client_id: str) -> None:
    pkce = Pkce.make()
    code = code_for(gateway.url, client_id, pkce)
    assert error_of(exchange(gateway.url, client_id, code, None)) == "invalid_request"


def test_a_code_with_a_wrong_verifier_gets_no_token(gateway: Writ, client_id: str) -> None:
    pkce = Pkce.make()
    code = code_for(gateway.url, client_id, pkce)
    assert error_of(exchange(gateway.url, client_id, code, Pkce.make().verifier)) == "invalid_grant"


def test_a_replayed_code_is_refused_and_the_tokens_issued_from_it_are_revoked(
    gateway: Writ, client_id: str
) -> None:
    pkce = Pkce.make()
    code = code_for(gateway.url, client_id, pkce)
    first = exchange(gateway.url, client_id, code, pkce.verifier).json()
    assert tools_list(gateway.mcp_url, first["access_token"]).status_code != 401
    assert error_of(exchange(gateway.url, client_id, code, pkce.verifier)) == "invalid_grant"
    assert tools_list(gateway.mcp_url, first["access_token"]).status_code == 401
    assert error_of(refresh(gateway.url, client_id, first["refresh_token"])) == "invalid_grant"


def test_a_resource_of_another_server_is_refused_at_authorize_and_at_token(
    gateway: Writ, client_id: str
) -> None:
    pkce = Pkce.make()
    params = authorization_params(client_id, pkce, resource="https://other.example/mcp")
    assert (
        redirected(httpx2.get(f"{gateway.url}/authorize", params=params, timeout=10))["error"]
        == "invalid_target"
    )
    code = code_for(gateway.url, client_id, pkce)
    other = exchange(gateway.url, client_id, code, pkce.verifier, resource="https://other.example/mcp")
    assert error_of(other) == "invalid_target"


def test_an_expired_code_gets_no_token(gateway: Writ, client_id: str) -> None:
    # A code issued as /authorize issues them, whose lifetime has run out.
    pkce = Pkce.make()
    now = gateway.runtime.clock()
    grant = code_grant(
        gateway.mcp_url,
        client_id,
        pkce,
        Grantee("demo-agent", "acme", ("agent",)),
        expires_at=now - timedelta(seconds=1),
    )
    gateway.runtime.store.issue_code("expired-code", grant, now=now - timedelta(seconds=61))
    assert error_of(exchange(gateway.url, client_id, "expired-code", pkce.verifier)) == "invalid_grant"


def test_a_refresh_token_is_rotated_and_reusing_an_old_one_revokes_the_newest_too(
    gateway: Writ, client_id: str
) -> None:
    pkce = Pkce.make()
    first = exchange(gateway.url, client_id, code_for(gateway.url, client_id, pkce), pkce.verifier).json()
    second = refresh(gateway.url, client_id, first["refresh_token"]).json()
    assert second["refresh_token"] != first["refresh_token"]
    assert tools_list(gateway.mcp_url, second["access_token"]).status_code != 401
    assert error_of(refresh(gateway.url, client_id, first["refresh_token"])) == "invalid_grant"
    assert error_of(refresh(gateway.url, client_id, second["refresh_token"])) == "invalid_grant"
    assert tools_list(gateway.mcp_url, second["access_token"]).status_code == 401


def test_denying_consent_sends_access_denied_to_the_client(gateway: Writ, client_id: str) -> None:
    back = redirected(sign_in(gateway.url, authorization_params(client_id, Pkce.make()), decision="deny"))
    assert back["error"] == "access_denied" and back["state"] == "st-1" and "code" not in back


def test_a_registration_with_a_non_loopback_http_redirect_is_refused(gateway: Writ) -> None:
    for uri in ("http://example.com/cb", "http://10.0.0.1:8000/cb", "myapp://cb"):
        response = httpx2.post(f"{gateway.url}/register", json={"redirect_uris": [uri]}, timeout=10)
        assert error_of(response) == "invalid_redirect_uri", uri
    for uri in ("https://client.example/cb", "http://localhost:9/cb", "http://[::1]:9/cb"):
        assert register(gateway.url, uri)["redirect_uris"] == [uri]


def test_a_client_revoking_its_refresh_token_ends_the_sign_in(gateway: Writ, client_id: str) -> None:
    pkce = Pkce.make()
    tokens = exchange(gateway.url, client_id, code_for(gateway.url, client_id, pkce), pkce.verifier).json()
    data = {"token": tokens["refresh_token"], "client_id": client_id}
    assert httpx2.post(f"{gateway.url}/revoke", data=data, timeout=10).status_code == 200
    assert tools_list(gateway.mcp_url, tokens["access_token"]).status_code == 401
    assert error_of(refresh(gateway.url, client_id, tokens["refresh_token"])) == "invalid_grant"


def test_a_console_session_opened_with_a_signed_in_token_ends_with_the_sign_in(
    gateway: Writ, client_id: str
) -> None:
    # The console's cookie holds a session id, not the token: the session must still end when the
    # sign-in its token came from is revoked (here by the client, RFC 7009), as the token does.
    pkce = Pkce.make()
    tokens = exchange(gateway.url, client_id, code_for(gateway.url, client_id, pkce), pkce.verifier).json()
    login = httpx2.post(f"{gateway.url}/console/login", data={"token": tokens["access_token"]}, timeout=10)
    assert login.status_code == 303, login.text
    cookie = {"Cookie": f"writ_session={login.cookies['writ_session']}"}
    inbox = httpx2.get(f"{gateway.url}/console/inbox", headers=cookie, timeout=10)
    assert inbox.status_code == 403 and "needs the approver" in inbox.text  # signed in, as an agent

    data = {"token": tokens["refresh_token"], "client_id": client_id}
    assert httpx2.post(f"{gateway.url}/revoke", data=data, timeout=10).status_code == 200

    inbox = httpx2.get(f"{gateway.url}/console/inbox", headers=cookie, timeout=10)
    assert inbox.status_code == 303 and inbox.headers["location"] == "/console/login"


def test_the_resource_metadata_names_only_servers_whose_endpoints_answer(gateway: Writ) -> None:
    resource = httpx2.get(f"{gateway.url}/.well-known/oauth-protected-resource/mcp", timeout=10).json()
    assert resource["resource"] == gateway.mcp_url
    assert resource["authorization_servers"], "the demo config runs Writ's authorization server"
    documents = [
        (issuer, f"{issuer.rstrip('/')}/.well-known/{kind}")
        for issuer in resource["authorization_servers"]
        for kind in ("oauth-authorization-server", "openid-configuration")  # RFC 8414, OpenID discovery
    ]
    for issuer, url in documents:
        metadata = httpx2.get(url, timeout=10)
        assert metadata.status_code == 200 and metadata.json()["issuer"] == issuer, url
        document = metadata.json()
        named = {
            key for key, value in document.items() if isinstance(value, str) and value.startswith("http")
        }
        assert named == {"issuer", "jwks_uri", *ENDPOINTS}, "a URL the checks below do not try"
        assert httpx2.get(document["jwks_uri"], timeout=10).json()["keys"]
        assert httpx2.get(document["authorization_endpoint"], timeout=10).status_code == 400  # no params
        for endpoint in ("token_endpoint", "revocation_endpoint"):
            answer = httpx2.post(document[endpoint], data={}, timeout=10)
            assert answer.status_code in (400, 401) and "error" in answer.json(), endpoint
        answer = httpx2.post(document["registration_endpoint"], json={}, timeout=10)
        assert answer.status_code == 400 and "error" in answer.json()


def test_writ_principals_revoke_ends_the_subjects_sign_ins_and_records_how_many(
    gateway: Writ, client_id: str
) -> None:
    pkce = Pkce.make()
    code = redirected(sign_in(gateway.url, authorization_params(client_id, pkce), user=1))["code"]
    tokens = exchange(gateway.url, client_id, code, pkce.verifier).json()
    assert tools_list(gateway.mcp_url, tokens["access_token"]).status_code != 401
    config = gateway.runtime.config.source
    assert config is not None
    root = gateway.token("root", roles="admin")
    args = ["principals", "revoke", "demo-approver", "--tenant", "acme", "--reason", "left", "--token", root]
    result = CliRunner().invoke(app, [*args, "-c", config])
    assert result.exit_code == 0, result.output
    assert "ended 1 sign-in of demo-approver at Writ's authorization server" in result.output
    assert tools_list(gateway.mcp_url, tokens["access_token"]).status_code == 401
    assert error_of(refresh(gateway.url, client_id, tokens["refresh_token"])) == "invalid_grant"
    revoked = [e for e in gateway.runtime.store.events(tenant="acme") if e.type == "principal.revoked"]
    assert revoked[-1].payload["subject"] == "demo-approver" and revoked[-1].payload["grants_revoked"] == 1


def test_a_client_registered_with_a_secret_must_present_it_at_token(gateway: Writ) -> None:
    registered = httpx2.post(
        f"{gateway.url}/register",
        json={"redirect_uris": [REDIRECT], "grant_types": ["authorization_code", "refresh_token"]},
        timeout=10,
    ).json()
    assert registered["token_endpoint_auth_method"] == "client_secret_basic" and registered["client_secret"]
    client_id, secret = registered["client_id"], registered["client_secret"]
    # The store keeps the secret's digest, never the secret.
    kept = gateway.runtime.store.get_client(client_id)
    assert kept is not None and kept.secret_hash == digest(secret) != secret
    pkce = Pkce.make()
    code = code_for(gateway.url, client_id, pkce)
    assert error_of(exchange(gateway.url, client_id, code, pkce.verifier), 401) == "invalid_client"
    data = {"grant_type": "authorization_code", "code": code, "redirect_uri": REDIRECT}
    data["code_verifier"] = pkce.verifier
    wrong = httpx2.post(f"{gateway.url}/token", data=data, auth=(client_id, "not-it"), timeout=10)
    assert error_of(wrong, 401) == "invalid_client"
    right = httpx2.post(f"{gateway.url}/token", data=data, auth=(client_id, secret), timeout=10)
    assert right.status_code == 200 and right.json()["refresh_token"]


def test_a_revoked_principal_cannot_sign_in(gateway: Writ, client_id: str) -> None:
    now = gateway.runtime.clock()
    gateway.runtime.store.revoke_principal(RevokePrincipal("acme", "demo-admin", revoked_by="root", now=now))
    with httpx2.Client(base_url=gateway.url, timeout=10) as browser:
        page = browser.get("/authorize", params=authorization_params(client_id, Pkce.make()))
        refused = browser.post("/authorize/login", data={"csrf": csrf_of(page.text), "user": "2"})
    assert refused.status_code == 403 and "demo-admin is revoked in tenant acme" in refused.text
    assert "/authorize/consent" not in refused.text
