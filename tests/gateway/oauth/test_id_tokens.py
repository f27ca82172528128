"""ID tokens from Writ's authorization server, as an OpenID client checks them: signed with the key
/jwks.json publishes under its `kid`, for this issuer and the client, with the request's nonce exactly
and the access token's `at_hash`; a new one at each refresh; none without `openid`. The OpenID
discovery document says the same as RFC 8414's, and the official SDK's OAuth client signs in with it
alone. Both stores; the browser's steps in plain HTTP (`flow.py`; Chromium is in test_sign_in.py)."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import anyio.to_thread
import httpx2
import pytest
from joserfc import jwt
from joserfc.jwk import KeySet
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientMetadata
from pydantic import AnyUrl

from tests.e2e.harness import demo_config, free_port
from tests.gateway.mcp.inproc import Writ, acme, served, writ
from tests.gateway.oauth.flow import (
    REDIRECT,
    Pkce,
    authorization_params,
    code_for,
    exchange,
    redirected,
    refresh,
    register,
    sign_in,
    tools_list,
)
from tests.gateway.oauth.test_sign_in import Storage
from tests.postgres import module_store_url

# Everything a nonce may hold that a careless echo would mangle: spaces, +, /, =, ~ and non-ASCII.
NONCE = "n-0S6_WzA2Mj ~+/=é"


store_url = module_store_url("writ_idtokens")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, store_url: str) -> Iterator[Writ]:
    with acme(tmp_path_factory.mktemp("acme")) as backend:
        workdir: Path = tmp_path_factory.mktemp("writ")
        with writ(workdir, backend, store_url) as g:
            yield g


@pytest.fixture(scope="module")
def client_id(gateway: Writ) -> str:
    return str(register(gateway.url)["client_id"])


def verified(gateway: Writ, id_token: str) -> dict[str, Any]:
    """The ID token's claims, verified as a client does: the key /jwks.json publishes, ES256, the
    issuer from the discovery document (expiry checked by joserfc's claims registry)."""
    discovery = httpx2.get(f"{gateway.url}/.well-known/openid-configuration", timeout=10).json()
    keys = KeySet.import_key_set(httpx2.get(discovery["jwks_uri"], timeout=10).json())
    token = jwt.decode(id_token, keys, algorithms=discovery["id_token_signing_alg_values_supported"])
    assert token.header["kid"] in {key["kid"] for key in keys.as_dict()["keys"]}
    jwt.JWTClaimsRegistry(iss={"essential": True, "value": discovery["issuer"]}).validate(token.claims)
    return dict(token.claims)


def at_hash(access_token: str) -> str:
    """OIDC Core §3.1.3.6: the left half of the access token's SHA-256, base64url without padding."""
    half = hashlib.sha256(access_token.encode()).digest()[:16]
    return base64.urlsafe_b64encode(half).decode().rstrip("=")


def signed_in_tokens(gateway: Writ, client_id: str, **params: str) -> dict[str, Any]:
    pkce = Pkce.make()
    response = exchange(
        gateway.url, client_id, code_for(gateway.url, client_id, pkce, **params), pkce.verifier
    )
    assert response.status_code == 200, response.text
    tokens: dict[str, Any] = response.json()
    return tokens


def test_with_openid_the_token_response_has_an_id_token_a_client_can_verify(
    gateway: Writ, client_id: str
) -> None:
    before = int(gateway.runtime.clock().timestamp())
    tokens = signed_in_tokens(gateway, client_id, scope="openid", nonce=NONCE)
    claims = verified(gateway, tokens["id_token"])
    assert tokens["scope"] == "openid"
    assert claims["iss"] == gateway.url + "/"
    assert claims["aud"] == client_id
    assert (claims["sub"], claims["tenant"]) == ("demo-agent", "acme")
    assert claims["nonce"] == NONCE
    assert claims["at_hash"] == at_hash(tokens["access_token"])
    assert before <= claims["auth_time"] <= claims["iat"] and claims["exp"] - claims["iat"] == 900
    # Who the user is, and nothing the client did not ask for: no roles, groups or scopes.
    assert set(claims) == {"iss", "sub", "aud", "exp", "iat", "auth_time", "nonce", "at_hash", "tenant"}
    # The access token beside it still works at /mcp.
    assert tools_list(gateway.mcp_url, tokens["access_token"]).status_code != 401


def test_without_a_nonce_the_id_token_has_none_and_without_openid_there_is_no_id_token(
    gateway: Writ, client_id: str
) -> None:
    plain = signed_in_tokens(gateway, client_id, scope="openid")
    assert "nonce" not in verified(gateway, plain["id_token"])
    assert "id_token" not in signed_in_tokens(gateway, client_id)
    assert "id_token" not in signed_in_tokens(gateway, client_id, nonce="ignored-without-openid")


def test_a_refresh_returns_a_new_id_token_for_the_same_sign_in_without_the_nonce(
    gateway: Writ, client_id: str
) -> None:
    first = signed_in_tokens(gateway, client_id, scope="openid", nonce="refresh-" + NONCE)
    response = refresh(gateway.url, client_id, first["refresh_token"])
    assert response.status_code == 200, response.text
    second = response.json()
    old, new = verified(gateway, first["id_token"]), verified(gateway, second["id_token"])
    for claim in ("iss", "sub", "aud", "auth_time", "tenant"):
        assert new[claim] == old[claim], claim
    assert new["at_hash"] == at_hash(second["access_token"]) != old["at_hash"]
    assert "nonce" not in new  # OIDC Core §12.2: a refresh is no authentication request


def test_a_nonce_sent_before_or_too_long_goes_back_to_the_client_as_invalid_request(
    gateway: Writ, client_id: str
) -> None:
    signed_in_tokens(gateway, client_id, scope="openid", nonce="once-" + NONCE)
    for nonce in ("once-" + NONCE, "x" * 256):
        params = authorization_params(client_id, Pkce.make(), scope="openid", nonce=nonce)
        answer = httpx2.get(f"{gateway.url}/authorize", params=params, timeout=10)
        back = redirected(answer)
        assert back["error"] == "invalid_request" and back["state"] == "st-1", back


def test_pkce_is_still_required_and_checked_when_openid_is_asked_for(gateway: Writ, client_id: str) -> None:
    params = authorization_params(client_id, None, scope="openid", nonce="no-pkce")
    back = redirected(httpx2.get(f"{gateway.url}/authorize", params=params, timeout=10))
    assert back["error"] == "invalid_request" and "PKCE" in back["error_description"]
    pkce = Pkce.make()
    code = code_for(gateway.url, client_id, pkce, scope="openid", nonce="wrong-verifier")
    wrong = exchange(gateway.url, client_id, code, Pkce.make().verifier)
    assert wrong.status_code == 400 and wrong.json()["error"] == "invalid_grant"
    assert "id_token" not in wrong.json()


def test_prompt_none_gets_login_required_since_writ_keeps_no_sign_in_session(
    gateway: Writ, client_id: str
) -> None:
    params = authorization_params(client_id, Pkce.make(), scope="openid", prompt="none")
    back = redirected(httpx2.get(f"{gateway.url}/authorize", params=params, timeout=10))
    assert back["error"] == "login_required"


def test_a_scope_the_server_does_not_offer_is_still_refused_beside_openid(
    gateway: Writ, client_id: str
) -> None:
    params = authorization_params(client_id, Pkce.make(), scope="openid admin:everything")
    back = redirected(httpx2.get(f"{gateway.url}/authorize", params=params, timeout=10))
    assert back["error"] == "invalid_scope"


def test_the_openid_discovery_document_names_the_same_issuer_and_endpoints_as_rfc_8414(gateway: Writ) -> None:
    oauth = httpx2.get(f"{gateway.url}/.well-known/oauth-authorization-server", timeout=10).json()
    origin = {"Origin": "http://localhost:6274"}  # a browser-based client, as the MCP Inspector is
    response = httpx2.get(f"{gateway.url}/.well-known/openid-configuration", headers=origin, timeout=10)
    assert response.status_code == 200 and response.headers["access-control-allow-origin"] == "*"
    openid = response.json()
    assert {k: openid[k] for k in oauth} == oauth
    assert openid["issuer"] == gateway.url + "/"
    assert openid["response_types_supported"] == ["code"]
    assert openid["subject_types_supported"] == ["public"]
    assert openid["id_token_signing_alg_values_supported"] == ["ES256"]
    assert openid["code_challenge_methods_supported"] == ["S256"]
    assert "openid" in openid["scopes_supported"] and "openid" in oauth["scopes_supported"]
    assert {"sub", "nonce", "at_hash", "auth_time", "tenant"} <= set(openid["claims_supported"])
    keys = httpx2.get(openid["jwks_uri"], timeout=10).json()["keys"]
    assert {key["alg"] for key in keys} == set(openid["id_token_signing_alg_values_supported"])


def test_a_signed_in_user_other_than_the_first_gets_their_own_sub(gateway: Writ, client_id: str) -> None:
    pkce = Pkce.make()
    params = authorization_params(client_id, pkce, scope="openid")
    code = redirected(sign_in(gateway.url, params, user=1))["code"]
    tokens = exchange(gateway.url, client_id, code, pkce.verifier).json()
    assert verified(gateway, tokens["id_token"])["sub"] == "demo-approver"


class OnlyOpenIdDiscovery(httpx2.AsyncBaseTransport):
    """The MCP client's network with Writ's RFC 8414 document unreachable (404), as where a proxy serves
    OpenID discovery alone; it notes each path asked for and each /token answer."""

    def __init__(self) -> None:
        self.inner = httpx2.AsyncHTTPTransport()
        self.asked: list[tuple[str, int]] = []
        self.token_answers: list[dict[str, Any]] = []

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if request.url.path.startswith("/.well-known/oauth-authorization-server"):
            response = httpx2.Response(404, json={"error": "not_found"})
        else:
            response = await self.inner.handle_async_request(request)
        if request.url.path == "/token":
            await response.aread()
            self.token_answers.append(response.json())
        self.asked.append((request.url.path, response.status_code))
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


@pytest.mark.anyio
async def test_the_sdk_client_signs_in_with_only_the_openid_discovery_document(
    gateway: Writ, client_id: str
) -> None:
    redirects: list[str] = []

    async def open_in_browser(url: str) -> None:
        params = dict(parse_qsl(urlsplit(url).query))
        consent = await anyio.to_thread.run_sync(lambda: sign_in(gateway.url, params))
        redirects.append(consent.headers["location"])

    async def code_from_redirect() -> AuthorizationCodeResult:
        back = redirected(httpx2.Response(302, headers={"location": redirects.pop()}))
        return AuthorizationCodeResult(code=back["code"], state=back.get("state"), iss=back.get("iss"))

    metadata = OAuthClientMetadata(
        redirect_uris=[AnyUrl(REDIRECT)],
        client_name="OpenID discovery test",
        grant_types=["authorization_code", "refresh_token"],
        response_types=["code"],
        token_endpoint_auth_method="none",
    )
    storage = Storage()
    auth = OAuthClientProvider(gateway.mcp_url, metadata, storage, open_in_browser, code_from_redirect)
    network = OnlyOpenIdDiscovery()
    async with (
        httpx2.AsyncClient(auth=auth, transport=network, timeout=30) as http,
        Client(streamable_http_client(gateway.mcp_url, http_client=http)) as client,
    ):
        names = {tool.name for tool in (await client.list_tools()).tools}
    assert {"lookup_order", "refund_order"} <= names
    assert ("/.well-known/oauth-authorization-server", 404) in network.asked
    assert ("/.well-known/openid-configuration", 200) in network.asked
    # The SDK asked for the scopes the metadata offers, `openid` among them, and got an ID token.
    assert storage.tokens is not None and storage.client is not None
    [answer] = network.token_answers
    claims = verified(gateway, answer["id_token"])
    assert (claims["sub"], claims["aud"]) == ("demo-agent", storage.client.client_id)
    assert claims["at_hash"] == at_hash(storage.tokens.access_token)


def test_for_an_issuer_with_a_path_both_documents_answer_where_clients_look(tmp_path: Path) -> None:
    (tmp_path / "acme").mkdir()
    with acme(tmp_path / "acme") as backend:
        port = free_port()
        issuer = f"http://127.0.0.1:{port}/writ"
        config = demo_config(
            tmp_path,
            gateway_port=port,
            backend_url=backend.url,
            store_url=f"sqlite:///{tmp_path / 'writ.db'}",
            server={"public_url": issuer},
        )
        with served(config, tmp_path) as gateway:
            # RFC 8414 §3 and §5 (as the MCP spec has clients try them): the path after the well-known part.
            for kind in ("oauth-authorization-server", "openid-configuration"):
                document = httpx2.get(f"{gateway.url}/.well-known/{kind}/writ", timeout=10)
                assert document.status_code == 200 and document.json()["issuer"] == issuer, kind
            # OpenID Discovery §4 appends it: {issuer}/.well-known/openid-configuration, which reaches
            # Writ as this path through the proxy that serves it under /writ.
            appended = httpx2.get(f"{gateway.url}/.well-known/openid-configuration", timeout=10).json()
            assert appended["issuer"] == issuer and appended["token_endpoint"] == f"{issuer}/token"


def test_registration_says_id_tokens_are_es256_and_refuses_another_algorithm(gateway: Writ) -> None:
    assert register(gateway.url)["id_token_signed_response_alg"] == "ES256"
    body = {"redirect_uris": [REDIRECT], "id_token_signed_response_alg": "RS256"}
    refused = httpx2.post(f"{gateway.url}/register", json=body, timeout=10)
    assert refused.status_code == 400 and refused.json()["error"] == "invalid_client_metadata"
    assert "ES256" in refused.json()["error_description"]
