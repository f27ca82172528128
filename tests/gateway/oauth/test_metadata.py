"""RFC 9728 metadata names only authorization servers that answer: without Writ's own (and with no
issuer configured) it names none, and the authorization server's endpoints are not there."""

from __future__ import annotations

from collections.abc import Iterator

import httpx2
import pytest

from tests.gateway.mcp.inproc import Writ, acme, writ


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Writ]:
    with acme(tmp_path_factory.mktemp("acme")) as backend:
        workdir = tmp_path_factory.mktemp("writ")
        store = f"sqlite:///{workdir / 'writ.db'}"
        with writ(workdir, backend, store, auth={"authorization_server": {"enabled": False}}) as g:
            yield g


def test_without_an_authorization_server_the_resource_metadata_names_none(gateway: Writ) -> None:
    for path in ("/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp"):
        metadata = httpx2.get(gateway.url + path, timeout=10).json()
        assert metadata["resource"] == gateway.mcp_url
        assert "authorization_servers" not in metadata
    for path in (
        "/.well-known/oauth-authorization-server",
        "/.well-known/openid-configuration",
        "/jwks.json",
        "/authorize",
    ):
        assert httpx2.get(gateway.url + path, timeout=10).status_code == 404
    assert httpx2.post(f"{gateway.url}/register", json={}, timeout=10).status_code == 404


def test_a_401_still_points_at_the_resource_metadata(gateway: Writ) -> None:
    response = httpx2.post(gateway.mcp_url, json={}, timeout=10)
    assert response.status_code == 401
    assert (
        f'resource_metadata="{gateway.url}/.well-known/oauth-protected-resource/mcp"'
        in (response.headers["www-authenticate"])
    )
