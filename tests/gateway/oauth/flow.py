"""The sign-in as a client and a browser make it, spelled out in plain HTTP (httpx2), for the cases
that refuse one step of it; the official client and a real browser are in test_sign_in.py."""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx2

from store.oauth import CodeGrant, Grantee

REDIRECT = "http://127.0.0.1:47123/callback"


@dataclass(frozen=True)
class Pkce:
    verifier: str
    challenge: str

    @classmethod
    def make(cls) -> Pkce:
        verifier = secrets.token_urlsafe(48)
        digest = hashlib.sha256(verifier.encode()).digest()
        return cls(verifier, base64.urlsafe_b64encode(digest).decode().rstrip("="))


def register(base: str, redirect: str = REDIRECT, **metadata: Any) -> dict[str, Any]:
    """A public client registered through /register (the body it got back)."""
    body = {
        "redirect_uris": [redirect],
        "client_name": "flow test",
        "token_endpoint_auth_method": "none",
        "grant_types": ["authorization_code", "refresh_token"],
        **metadata,
    }
    response = httpx2.post(f"{base}/register", json=body, timeout=10)
    assert response.status_code == 201, response.text
    client: dict[str, Any] = response.json()
    return client


def authorization_params(client_id: str, pkce: Pkce | None, **params: str) -> dict[str, str]:
    query = {"response_type": "code", "client_id": client_id, "redirect_uri": REDIRECT, "state": "st-1"}
    if pkce is not None:
        query |= {"code_challenge": pkce.challenge, "code_challenge_method": "S256"}
    return query | params


def redirected(response: httpx2.Response) -> dict[str, str]:
    """The parameters of a redirect to the client (one value each)."""
    assert response.status_code == 302, response.text
    location = response.headers["location"]
    assert location.startswith(REDIRECT + "?"), location
    return {k: v[0] for k, v in parse_qs(urlsplit(location).query).items()}


def sign_in(base: str, params: dict[str, str], *, user: int = 0, decision: str = "allow") -> httpx2.Response:
    """/authorize, the built-in login as user number `user`, then the consent: the last response."""
    with httpx2.Client(base_url=base, timeout=10) as browser:
        page = browser.get("/authorize", params=params)
        assert page.status_code == 200, page.text
        csrf = csrf_of(page.text)
        consent = browser.post("/authorize/login", data={"csrf": csrf, "user": str(user)})
        assert consent.status_code == 200, consent.text
        return browser.post("/authorize/consent", data={"csrf": csrf, "decision": decision})


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, page
    return found.group(1)


def code_for(base: str, client_id: str, pkce: Pkce, **params: str) -> str:
    return redirected(sign_in(base, authorization_params(client_id, pkce, **params)))["code"]


def exchange(base: str, client_id: str, code: str, verifier: str | None, **extra: str) -> httpx2.Response:
    data = {
        "grant_type": "authorization_code",
        "code": code,
        "redirect_uri": REDIRECT,
        "client_id": client_id,
    }
    if verifier is not None:
        data["code_verifier"] = verifier
    return httpx2.post(f"{base}/token", data=data | extra, timeout=10)


def refresh(base: str, client_id: str, token: str) -> httpx2.Response:
    data = {"grant_type": "refresh_token", "refresh_token": token, "client_id": client_id}
    return httpx2.post(f"{base}/token", data=data, timeout=10)


def tools_list(mcp_url: str, token: str) -> httpx2.Response:
    """A stateless tools/list with a bearer token (the status says whether the token was taken)."""
    return httpx2.post(
        mcp_url,
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}},
        headers={
            "Authorization": f"Bearer {token}",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2025-11-25",
        },
        timeout=10,
    )


def code_grant(
    resource: str, client_id: str, pkce: Pkce, grantee: Grantee, *, expires_at: datetime, **more: Any
) -> CodeGrant:
    """A code's grant as /authorize would issue it (a family of its own, `REDIRECT`, S256), for a case
    that puts one in the store itself at a moment of its choosing (`more`: `auth_time`, say)."""
    return CodeGrant(
        family_id=uuid.uuid4().hex,
        client_id=client_id,
        redirect_uri=REDIRECT,
        scope="",
        resource=resource,
        code_challenge=pkce.challenge,
        code_challenge_method="S256",
        grantee=grantee,
        expires_at=expires_at,
        **more,
    )
