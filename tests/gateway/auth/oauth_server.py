"""A real OAuth 2.0 authorization server for tests, built with authlib and starlette, run under uvicorn.

It issues JWT access tokens (RS256 or ES256, per client) and opaque tokens through the client
credentials grant, serves OpenID discovery and RFC 8414 metadata, a JWKS and RFC 7662 introspection.
Test-only endpoints under `/_test/` rotate the keys, take the JWKS down and sign arbitrary claims with
the server's own current key (for expired, not-yet-valid, wrong-audience tokens), make the token
endpoint fail, and count token requests per client (Writ's own backend clients fetch tokens here).

    python -m tests.gateway.auth.oauth_server --port 9000 --audience http://127.0.0.1:8080/mcp
"""

from __future__ import annotations

import argparse
import contextvars
import os
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

os.environ.setdefault("AUTHLIB_INSECURE_TRANSPORT", "1")  # plain http on 127.0.0.1 in tests

import anyio  # noqa: E402
import uvicorn  # noqa: E402
from authlib.oauth2.rfc6749 import AuthorizationServer, ClientMixin, OAuth2Request  # noqa: E402
from authlib.oauth2.rfc6749.errors import OAuth2Error  # noqa: E402
from authlib.oauth2.rfc6749.grants import ClientCredentialsGrant  # noqa: E402
from authlib.oauth2.rfc6749.requests import BasicOAuth2Payload  # noqa: E402
from authlib.oauth2.rfc6750 import BearerTokenGenerator  # noqa: E402
from joserfc import jwt  # noqa: E402
from joserfc.jwk import ECKey, RSAKey  # noqa: E402
from starlette.applications import Starlette  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import JSONResponse, Response  # noqa: E402
from starlette.routing import Route  # noqa: E402

# The test clients: id -> (secret, how its tokens look).
CLIENTS: dict[str, dict[str, Any]] = {
    "agent-rs": {"secret": "rs-client-secret-1", "alg": "RS256", "tenant": "acme", "roles": ["agent"]},
    "agent-es": {"secret": "es-client-secret-2", "alg": "ES256", "tenant": "acme", "roles": ["agent"]},
    "agent-globex": {"secret": "globex-secret-3", "alg": "ES256", "tenant": "globex", "roles": ["agent"]},
    "approver-rs": {"secret": "approver-secret-4", "alg": "RS256", "tenant": "acme", "roles": ["approver"]},
    "agent-opaque": {"secret": "opaque-secret-5", "opaque": True, "tenant": "acme", "roles": ["agent"]},
    "writ-introspect": {"secret": "introspect-secret-6", "introspect": True},
    # Writ itself, getting tokens to call backends; "writ-backend-short" gets 4-second tokens.
    "writ-backend": {"secret": "backend-client-secret-7", "alg": "RS256", "roles": ["service"]},
    "writ-backend-short": {"secret": "short-client-secret-8", "alg": "ES256", "ttl": 4},
}

_resource: contextvars.ContextVar[str | None] = contextvars.ContextVar("resource", default=None)


@dataclass
class Client(ClientMixin):
    client_id: str
    spec: dict[str, Any]

    def get_client_id(self) -> str:
        return self.client_id

    def get_default_redirect_uri(self) -> str | None:
        return None

    def get_allowed_scope(self, scope: str | None) -> str:
        return scope or ""

    def check_redirect_uri(self, redirect_uri: str) -> bool:
        return False

    def check_client_secret(self, client_secret: str) -> bool:
        return secrets.compare_digest(client_secret, self.spec["secret"])

    def check_endpoint_auth_method(self, method: str, endpoint: str) -> bool:
        return method in ("client_secret_basic", "client_secret_post")

    def check_response_type(self, response_type: str) -> bool:
        return False

    def check_grant_type(self, grant_type: str) -> bool:
        return grant_type == "client_credentials" and not self.spec.get("introspect")


@dataclass
class Keys:
    rsa: RSAKey = field(default_factory=lambda: RSAKey.generate_key(2048, auto_kid=True))
    ec: ECKey = field(default_factory=lambda: ECKey.generate_key("P-256", auto_kid=True))

    def for_alg(self, alg: str) -> RSAKey | ECKey:
        return self.rsa if alg.startswith(("RS", "PS")) else self.ec

    def jwks(self) -> dict[str, Any]:
        return {
            "keys": [
                self.rsa.as_dict(private=False) | {"alg": "RS256", "use": "sig"},
                self.ec.as_dict(private=False) | {"alg": "ES256", "use": "sig"},
            ]
        }


class _Request(OAuth2Request):
    def __init__(self, method: str, uri: str, headers: Any, form: dict[str, str]) -> None:
        super().__init__(method, uri, headers=headers)
        self.payload = BasicOAuth2Payload(form)
        self._form = form

    @property
    def form(self) -> dict[str, str]:
        return self._form

    @property
    def args(self) -> dict[str, str]:
        return {}


class State:
    def __init__(self, issuer: str, audience: str, ttl_s: int) -> None:
        self.issuer = issuer
        self.audience = audience
        self.ttl_s = ttl_s
        self.keys = Keys()
        self.jwks_status = 200
        self.opaque: dict[str, dict[str, Any]] = {}
        self.jwks_fetches = 0
        self.token_status = 200
        self.token_delay_s = 0.0
        self.token_requests: dict[str, int] = {}

    def sign(self, claims: dict[str, Any], alg: str) -> str:
        key = self.keys.for_alg(alg)
        return jwt.encode({"alg": alg, "kid": key.kid, "typ": "at+jwt"}, claims, key)

    def claims_for(self, client: Client, scope: str | None) -> dict[str, Any]:
        now = int(time.time())
        claims: dict[str, Any] = {
            "iss": self.issuer,
            "sub": client.client_id,
            "aud": _resource.get() or self.audience,
            "client_id": client.client_id,
            "iat": now,
            "nbf": now,
            "exp": now + int(client.spec.get("ttl", self.ttl_s)),
            "jti": secrets.token_hex(8),
            "tenant": client.spec.get("tenant"),
            "roles": client.spec.get("roles", []),
        }
        if scope:
            claims["scope"] = scope
        return claims


class _ClientCredentials(ClientCredentialsGrant):
    TOKEN_ENDPOINT_AUTH_METHODS = ["client_secret_basic", "client_secret_post"]  # as the metadata says


class Server(AuthorizationServer):
    def __init__(self, state: State) -> None:
        super().__init__()
        self.state = state

    def query_client(self, client_id: str) -> Client | None:
        spec = CLIENTS.get(client_id)
        return Client(client_id, spec) if spec else None

    def save_token(self, token: dict[str, Any], request: Any) -> None:
        pass

    def send_signal(self, name: str, *args: Any, **kwargs: Any) -> None:
        pass

    def create_oauth2_request(self, request: _Request) -> _Request:
        return request

    def handle_response(self, status: int, body: Any, headers: Any) -> Response:
        return JSONResponse(body, status_code=status, headers=dict(headers))


def build_app(issuer: str, audience: str, ttl_s: int = 600) -> Starlette:
    state = State(issuer, audience, ttl_s)
    server = Server(state)

    def access_token(client: Client, grant_type: str, user: Any, scope: str | None) -> str:
        claims = state.claims_for(client, scope)
        if client.spec.get("opaque"):
            token = secrets.token_urlsafe(32)
            state.opaque[token] = claims
            return token
        return state.sign(claims, client.spec["alg"])

    def expires_in(client: Client, grant_type: str) -> int:
        return int(client.spec.get("ttl", ttl_s))

    server.register_token_generator(
        "default", BearerTokenGenerator(access_token, expires_generator=expires_in)
    )
    server.register_grant(_ClientCredentials)

    def metadata() -> dict[str, Any]:
        return {
            "issuer": issuer,
            "token_endpoint": f"{issuer}/token",
            "jwks_uri": f"{issuer}/jwks.json",
            "introspection_endpoint": f"{issuer}/introspect",
            "grant_types_supported": ["client_credentials"],
            "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post"],
            "id_token_signing_alg_values_supported": ["RS256", "ES256"],
        }

    async def discovery(request: Request) -> Response:
        return JSONResponse(metadata())

    async def jwks(request: Request) -> Response:
        state.jwks_fetches += 1
        if state.jwks_status != 200:
            return JSONResponse({"error": "down"}, status_code=state.jwks_status)
        return JSONResponse(state.keys.jwks())

    async def token(request: Request) -> Response:
        form = {k: str(v) for k, v in (await request.form()).items()}
        client_id = _basic_client_id(request) or form.get("client_id", "")
        state.token_requests[client_id] = state.token_requests.get(client_id, 0) + 1
        if state.token_delay_s:
            await anyio.sleep(state.token_delay_s)
        if state.token_status != 200:
            return JSONResponse({"error": "temporarily_unavailable"}, status_code=state.token_status)
        oauth_request = _Request(request.method, str(request.url), request.headers, form)
        reset = _resource.set(form.get("resource"))
        try:
            return server.create_token_response(oauth_request)
        finally:
            _resource.reset(reset)

    async def introspect(request: Request) -> Response:
        form = {k: str(v) for k, v in (await request.form()).items()}
        oauth_request = _Request(request.method, str(request.url), request.headers, form)
        client = server.query_client(_basic_client_id(request) or "")
        if client is None or not client.spec.get("introspect"):
            return JSONResponse({"error": "invalid_client"}, status_code=401)
        try:
            server.authenticate_client(oauth_request, ["client_secret_basic"], "introspection")
        except OAuth2Error:
            return JSONResponse({"error": "invalid_client"}, status_code=401)
        claims = state.opaque.get(form.get("token", ""))
        if claims is None or claims["exp"] < time.time():
            return JSONResponse({"active": False})
        return JSONResponse({"active": True, "token_type": "Bearer", **claims})

    async def rotate(request: Request) -> Response:
        state.keys = Keys()
        return JSONResponse({"rsa": state.keys.rsa.kid, "ec": state.keys.ec.kid})

    async def set_jwks(request: Request) -> Response:
        state.jwks_status = int((await request.json()).get("status", 200))
        return JSONResponse({"status": state.jwks_status})

    async def mint(request: Request) -> Response:
        body = await request.json()
        now = int(time.time())
        claims = {"iss": issuer, "aud": audience, "iat": now, "nbf": now, "exp": now + ttl_s}
        claims.update(body.get("claims", {}))
        return JSONResponse({"access_token": state.sign(claims, body.get("alg", "ES256"))})

    async def revoke_opaque(request: Request) -> Response:
        state.opaque.pop((await request.json())["token"], None)
        return JSONResponse({})

    async def set_token(request: Request) -> Response:
        body = await request.json()
        state.token_status = int(body.get("status", 200))
        state.token_delay_s = float(body.get("delay_s", 0.0))
        return JSONResponse({"status": state.token_status, "delay_s": state.token_delay_s})

    async def stats(request: Request) -> Response:
        return JSONResponse({"jwks_fetches": state.jwks_fetches, "token_requests": state.token_requests})

    async def healthz(request: Request) -> Response:
        return JSONResponse({"ok": True})

    return Starlette(
        routes=[
            Route("/.well-known/openid-configuration", discovery),
            Route("/.well-known/oauth-authorization-server", discovery),
            Route("/jwks.json", jwks),
            Route("/token", token, methods=["POST"]),
            Route("/introspect", introspect, methods=["POST"]),
            Route("/_test/rotate", rotate, methods=["POST"]),
            Route("/_test/jwks", set_jwks, methods=["POST"]),
            Route("/_test/mint", mint, methods=["POST"]),
            Route("/_test/token", set_token, methods=["POST"]),
            Route("/_test/revoke", revoke_opaque, methods=["POST"]),
            Route("/_test/stats", stats),
            Route("/healthz", healthz),
        ]
    )


def _basic_client_id(request: Request) -> str | None:
    import base64

    header = request.headers.get("authorization", "")
    if not header.lower().startswith("basic "):
        return None
    try:
        return base64.b64decode(header[6:]).decode().split(":", 1)[0]
    except ValueError:
        return None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--audience", required=True)
    parser.add_argument("--ttl", type=int, default=600)
    args = parser.parse_args()
    issuer = f"http://127.0.0.1:{args.port}"
    uvicorn.run(
        build_app(issuer, args.audience, args.ttl), host="127.0.0.1", port=args.port, log_level="warning"
    )


if __name__ == "__main__":
    main()
