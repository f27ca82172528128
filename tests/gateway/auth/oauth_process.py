"""Run the test authorization server (`tests/gateway/auth/oauth_server.py`) as a real process and drive it."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx2

from tests.e2e.harness import REPO, free_port, stop, wait_http
from tests.gateway.auth.oauth_server import CLIENTS


@dataclass
class AuthServer:
    issuer: str
    process: subprocess.Popen[Any] | None
    """None when served in the test process (`tests/gateway/mcp/inproc.py`)."""

    def token(self, client_id: str, *, scope: str | None = None, resource: str | None = None) -> str:
        """An access token through the client credentials grant (client_secret_basic)."""
        form = {"grant_type": "client_credentials"}
        if scope:
            form["scope"] = scope
        if resource:
            form["resource"] = resource
        response = httpx2.post(
            f"{self.issuer}/token", data=form, auth=(client_id, CLIENTS[client_id]["secret"]), timeout=10
        )
        response.raise_for_status()
        return response.json()["access_token"]

    def mint(self, alg: str = "ES256", **claims: Any) -> str:
        """A token signed with the server's current key, with these claims over sensible defaults."""
        response = httpx2.post(f"{self.issuer}/_test/mint", json={"alg": alg, "claims": claims}, timeout=10)
        response.raise_for_status()
        return response.json()["access_token"]

    def rotate_keys(self) -> None:
        httpx2.post(f"{self.issuer}/_test/rotate", timeout=10).raise_for_status()

    def set_jwks_status(self, status: int) -> None:
        httpx2.post(f"{self.issuer}/_test/jwks", json={"status": status}, timeout=10).raise_for_status()

    def revoke_opaque(self, token: str) -> None:
        httpx2.post(f"{self.issuer}/_test/revoke", json={"token": token}, timeout=10).raise_for_status()

    def jwks_fetches(self) -> int:
        return httpx2.get(f"{self.issuer}/_test/stats", timeout=10).json()["jwks_fetches"]

    def token_requests(self, client_id: str) -> int:
        """How many times `client_id` asked the token endpoint (answered or not)."""
        stats = httpx2.get(f"{self.issuer}/_test/stats", timeout=10).json()
        return stats["token_requests"].get(client_id, 0)

    def set_token_endpoint(self, status: int = 200, delay_s: float = 0.0) -> None:
        """Make the token endpoint answer `status` (an OAuth error unless 200), after `delay_s`."""
        body = {"status": status, "delay_s": delay_s}
        httpx2.post(f"{self.issuer}/_test/token", json=body, timeout=10).raise_for_status()


@contextlib.contextmanager
def auth_server(audience: str, *, port: int | None = None) -> Iterator[AuthServer]:
    port = port or free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.gateway.auth.oauth_server",
            "--port",
            str(port),
            "--audience",
            audience,
        ],
        cwd=REPO,
    )
    try:
        issuer = f"http://127.0.0.1:{port}"
        wait_http(f"{issuer}/healthz", process)
        yield AuthServer(issuer, process)
    finally:
        stop(process)
