"""A small OpenID provider for tests, run as a real process: what Writ's upstream sign-in talks to.

Like the enterprise providers it stands for, it has NO registration endpoint: its one client (Writ)
is registered statically on the command line, with a secret and its exact redirect URIs. It serves
OpenID discovery, a JWKS (RS256), `/authorize` (authorization code, PKCE S256 required) with a login
form asking a user name and password (and a Cancel button, which answers `access_denied`), and a
token endpoint (client_secret_basic) whose ID tokens carry the user's claims the way Keycloak does:
roles nested under `realm_access.roles`, groups in `groups`, the organisation in `org`.

Its issuer is `http://localhost:PORT`, another site than Writ's `127.0.0.1` to a browser, so the
sign-in cookies must come back on a cross-site redirect, as they do from a real provider.

`POST /_test/next_id_token` with claims to put into the next ID token (a wrong `aud` or `nonce`);
`POST /_test/next_token_status` makes the next token request fail with that HTTP status (an HTML
page, as a proxy in front of a provider answers); `GET /_test/stats` counts the token requests.

    python -m tests.gateway.oauth.oidc_provider --port 9100 --client-id writ --client-secret s3cret \
        --redirect-uri http://127.0.0.1:8080/authorize/oidc/corp/callback
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import html
import secrets
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote_plus, urlencode

import uvicorn
from joserfc import jwt
from joserfc.jwk import RSAKey
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

USERS: dict[str, dict[str, Any]] = {
    "alice": {
        "password": "alice-password",
        "name": "Alice Agent",
        "org": "acme",
        "realm_access": {"roles": ["agent"]},
        "groups": ["payments"],
    },
    "bob": {
        "password": "bob-password",
        "name": "Bob Approver",
        "org": "acme",
        "realm_access": {"roles": ["approver"]},
        "groups": ["finance"],
    },
    "eve": {
        "password": "eve-password",
        "name": "Eve Elsewhere",
        "org": "globex",
        "realm_access": {"roles": ["admin"]},
        "groups": [],
    },
}


@dataclass
class Provider:
    issuer: str
    client_id: str
    client_secret: str
    redirect_uris: list[str]
    key: RSAKey = field(
        default_factory=lambda: RSAKey.generate_key(2048, parameters={"kid": "k1"}, private=True)
    )
    codes: dict[str, dict[str, Any]] = field(default_factory=dict)
    next_claims: dict[str, Any] = field(default_factory=dict)
    next_token_status: int = 200
    token_requests: int = 0

    def discovery(self) -> dict[str, Any]:
        return {
            "issuer": self.issuer,
            "authorization_endpoint": f"{self.issuer}/authorize",
            "token_endpoint": f"{self.issuer}/token",
            "jwks_uri": f"{self.issuer}/jwks",
            "response_types_supported": ["code"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": ["client_secret_basic"],
            "scopes_supported": ["openid", "profile", "email"],
        }

    def id_token(self, user: str, nonce: str | None) -> str:
        now = int(time.time())
        profile = {k: v for k, v in USERS[user].items() if k != "password"}
        claims: dict[str, Any] = {
            "iss": self.issuer,
            "sub": f"{user}@example.test",
            "aud": self.client_id,
            "iat": now,
            "exp": now + 300,
            **profile,
        }
        if nonce is not None:
            claims["nonce"] = nonce
        claims.update(self.next_claims)
        self.next_claims = {}
        return jwt.encode({"alg": "RS256", "kid": "k1"}, claims, self.key)


def login_form(params: dict[str, str], problem: str = "") -> HTMLResponse:
    hidden = "".join(
        f'<input type="hidden" name="{html.escape(k)}" value="{html.escape(v)}">' for k, v in params.items()
    )
    alert = f'<p id="problem">{html.escape(problem)}</p>' if problem else ""
    return HTMLResponse(
        "<!doctype html><title>Example IdP</title><h1 id=idp>Example identity provider</h1>"
        f'{alert}<form method="post" action="/authorize">{hidden}'
        '<label>User <input name="username" id="username"></label>'
        '<label>Password <input name="password" id="password" type="password"></label>'
        '<button name="action" value="login" id="login">Sign in</button>'
        '<button name="action" value="cancel" id="cancel">Cancel</button></form>'
    )


def build_app(provider: Provider) -> Starlette:
    def to_client(redirect_uri: str, **params: str) -> Response:
        return RedirectResponse(f"{redirect_uri}?{urlencode(params)}", status_code=302)

    async def discovery(request: Request) -> Response:
        return JSONResponse(provider.discovery())

    async def jwks(request: Request) -> Response:
        return JSONResponse({"keys": [provider.key.as_dict(private=False) | {"use": "sig", "alg": "RS256"}]})

    async def authorize(request: Request) -> Response:
        params = dict(request.query_params if request.method == "GET" else (await request.form()).items())
        params = {k: str(v) for k, v in params.items()}
        if (
            params.get("client_id") != provider.client_id
            or params.get("redirect_uri") not in provider.redirect_uris
        ):
            return HTMLResponse("<p id=problem>unknown client or redirect_uri</p>", status_code=400)
        redirect_uri, state = params["redirect_uri"], params.get("state", "")
        if params.get("response_type") != "code" or params.get("code_challenge_method") != "S256":
            return to_client(redirect_uri, error="invalid_request", state=state)
        if "openid" not in params.get("scope", "").split():
            return to_client(redirect_uri, error="invalid_scope", state=state)
        request_params = {
            k: params[k]
            for k in (
                "response_type",
                "client_id",
                "redirect_uri",
                "scope",
                "state",
                "nonce",
                "code_challenge",
            )
            if k in params
        } | {"code_challenge_method": "S256"}
        if request.method == "GET":
            return login_form(request_params)
        if params.get("action") == "cancel":
            return to_client(
                redirect_uri, error="access_denied", error_description="the user cancelled", state=state
            )
        user = USERS.get(params.get("username", ""))
        if user is None or not secrets.compare_digest(user["password"], params.get("password", "")):
            return login_form(request_params, "Wrong user name or password.")
        code = secrets.token_urlsafe(24)
        provider.codes[code] = {
            "user": params["username"],
            "redirect_uri": redirect_uri,
            "challenge": params["code_challenge"],
            "nonce": params.get("nonce"),
            "expires": time.time() + 60,
        }
        return to_client(redirect_uri, code=code, state=state, iss=provider.issuer)

    async def token(request: Request) -> Response:
        provider.token_requests += 1
        if provider.next_token_status != 200:
            status, provider.next_token_status = provider.next_token_status, 200
            return HTMLResponse("<p>down for maintenance</p>", status_code=status)
        form = {k: str(v) for k, v in (await request.form()).items()}
        scheme, _, encoded = request.headers.get("authorization", "").partition(" ")
        try:
            given_id, _, given_secret = base64.b64decode(encoded).decode().partition(":")
        except ValueError:
            given_id = given_secret = ""
        if (
            scheme.lower() != "basic"
            or unquote_plus(given_id) != provider.client_id
            or not secrets.compare_digest(unquote_plus(given_secret), provider.client_secret)
        ):
            return JSONResponse({"error": "invalid_client"}, status_code=401)
        grant = provider.codes.pop(form.get("code", ""), None)
        if form.get("grant_type") != "authorization_code" or grant is None or grant["expires"] < time.time():
            return JSONResponse({"error": "invalid_grant"}, status_code=400)
        verifier = form.get("code_verifier", "")
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).decode().rstrip("=")
        if form.get("redirect_uri") != grant["redirect_uri"] or challenge != grant["challenge"]:
            return JSONResponse(
                {"error": "invalid_grant", "error_description": "PKCE or redirect"}, status_code=400
            )
        return JSONResponse(
            {
                "access_token": secrets.token_urlsafe(24),
                "token_type": "Bearer",
                "expires_in": 300,
                "id_token": provider.id_token(grant["user"], grant["nonce"]),
            },
            headers={"Cache-Control": "no-store"},
        )

    async def next_id_token(request: Request) -> Response:
        provider.next_claims = dict(await request.json())
        return JSONResponse({})

    async def next_token_status(request: Request) -> Response:
        provider.next_token_status = int((await request.json())["status"])
        return JSONResponse({})

    async def stats(request: Request) -> Response:
        return JSONResponse({"token_requests": provider.token_requests})

    async def healthz(request: Request) -> Response:
        return JSONResponse({"ok": True})

    return Starlette(
        routes=[
            Route("/.well-known/openid-configuration", discovery),
            Route("/jwks", jwks),
            Route("/authorize", authorize, methods=["GET", "POST"]),
            Route("/token", token, methods=["POST"]),
            Route("/_test/next_id_token", next_id_token, methods=["POST"]),
            Route("/_test/next_token_status", next_token_status, methods=["POST"]),
            Route("/_test/stats", stats),
            Route("/healthz", healthz),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--client-id", required=True)
    parser.add_argument("--client-secret", required=True)
    parser.add_argument("--redirect-uri", action="append", required=True)
    args = parser.parse_args()
    provider = Provider(
        f"http://localhost:{args.port}", args.client_id, args.client_secret, args.redirect_uri
    )
    uvicorn.run(build_app(provider), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
