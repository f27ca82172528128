"""The CLI's `--token` takes a token of Writ's authorization server as the gateway does, and refuses
it once its sign-in is revoked."""

from __future__ import annotations

from collections.abc import Iterator

import httpx2
import pytest
from typer.testing import CliRunner

from gateway.cli.main import app
from tests.gateway.mcp.inproc import Writ, acme, writ
from tests.gateway.oauth.flow import Pkce, code_for, exchange, register

ADMIN = {"subject": "ada", "tenant": "acme", "roles": ["admin"]}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Writ]:
    with acme(tmp_path_factory.mktemp("acme")) as backend:
        workdir = tmp_path_factory.mktemp("writ")
        section = {
            "enabled": True,
            "key_file": str(workdir / "oauth-keys.json"),
            "login": {"type": "builtin", "users": [ADMIN]},
        }
        store = f"sqlite:///{workdir / 'writ.db'}"
        with writ(workdir, backend, store, auth={"authorization_server": section}) as g:
            yield g


def test_a_signed_in_admin_token_acts_in_the_cli_until_its_sign_in_is_revoked(gateway: Writ) -> None:
    client_id = register(gateway.url)["client_id"]
    pkce = Pkce.make()
    tokens = exchange(gateway.url, client_id, code_for(gateway.url, client_id, pkce), pkce.verifier).json()
    config = gateway.runtime.config.source
    assert config is not None

    def revoke(subject: str) -> tuple[int, str]:
        args = ["principals", "revoke", subject, "--tenant", "acme", "--token", tokens["access_token"]]
        result = CliRunner().invoke(app, [*args, "-c", config])
        return result.exit_code, result.output

    code, output = revoke("mallory")
    assert code == 0 and "revoked mallory in tenant acme" in output and "by ada" in output
    data = {"token": tokens["refresh_token"], "client_id": client_id}
    assert httpx2.post(f"{gateway.url}/revoke", data=data, timeout=10).status_code == 200
    code, output = revoke("trent")
    assert code != 0 and "did not verify" in output
    assert not gateway.runtime.store.is_revoked("acme", "trent")
