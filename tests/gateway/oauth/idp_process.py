"""Run the test OpenID provider (`oidc_provider.py`) as a real process, with Writ registered there."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx2

from tests.e2e.harness import REPO, free_port, stop, wait_http

CLIENT_ID = "writ-gateway"
SECRET = "writ-at-the-idp-secret"


@dataclass
class Idp:
    issuer: str

    def next_id_token(self, **claims: Any) -> None:
        """Put these claims into the next ID token the provider issues (a wrong `aud`, `nonce`...)."""
        httpx2.post(f"{self.issuer}/_test/next_id_token", json=claims, timeout=10).raise_for_status()

    def fail_next_token_request(self, status: int) -> None:
        httpx2.post(
            f"{self.issuer}/_test/next_token_status", json={"status": status}, timeout=10
        ).raise_for_status()

    def token_requests(self) -> int:
        return int(httpx2.get(f"{self.issuer}/_test/stats", timeout=10).json()["token_requests"])


@contextlib.contextmanager
def idp(redirect_uris: list[str]) -> Iterator[Idp]:
    """The provider on a free port, knowing Writ (`CLIENT_ID`, `SECRET`) with these redirect URIs."""
    port = free_port()
    command = [sys.executable, "-m", "tests.gateway.oauth.oidc_provider", f"--port={port}"]
    command += [f"--client-id={CLIENT_ID}", f"--client-secret={SECRET}"]
    command += [f"--redirect-uri={uri}" for uri in redirect_uris]
    process = subprocess.Popen(command, cwd=REPO)
    try:
        issuer = f"http://localhost:{port}"  # another site than Writ's 127.0.0.1, as a real provider is
        wait_http(f"{issuer}/healthz", process)
        yield Idp(issuer)
    finally:
        stop(process)
