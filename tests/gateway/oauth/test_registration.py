"""Dynamic registration is open but limited per client address, in the store (shared by replicas)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx2
import pytest

from tests.gateway.mcp.inproc import Writ, acme, writ
from tests.gateway.oauth.flow import REDIRECT

LOGIN = {"type": "builtin", "users": [{"subject": "demo-agent", "tenant": "acme", "roles": ["agent"]}]}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Writ]:
    with acme(tmp_path_factory.mktemp("acme")) as backend:
        workdir = tmp_path_factory.mktemp("writ")
        section = {
            "enabled": True,
            "key_file": str(workdir / "oauth-keys.json"),
            "login": LOGIN,
            "registrations_per_minute": 1,
            "registration_burst": 3,
        }
        store = f"sqlite:///{workdir / 'writ.db'}"
        with writ(workdir, backend, store, auth={"authorization_server": section}) as g:
            yield g


def test_registrations_past_the_burst_from_one_address_get_429_with_retry_after(gateway: Writ) -> None:
    body = {"redirect_uris": [REDIRECT], "token_endpoint_auth_method": "none"}
    answers = [httpx2.post(f"{gateway.url}/register", json=body, timeout=10) for _ in range(4)]
    assert [a.status_code for a in answers] == [201, 201, 201, 429]
    assert answers[-1].json()["error"] == "too_many_requests"
    assert 1 <= int(answers[-1].headers["retry-after"]) <= 60
    registered = {a.json()["client_id"] for a in answers[:3]}
    assert all(gateway.runtime.store.get_client(c) is not None for c in registered)


def test_a_client_past_the_burst_gets_no_more_by_naming_other_addresses_in_x_forwarded_for(
    gateway: Writ,
) -> None:
    body = {"redirect_uris": [REDIRECT], "token_endpoint_auth_method": "none"}
    for _ in range(4):  # the burst is 3: spent here unless a case before this one spent it
        if httpx2.post(f"{gateway.url}/register", json=body, timeout=10).status_code == 429:
            break
    spoofed = [
        httpx2.post(
            f"{gateway.url}/register", json=body, headers={"X-Forwarded-For": f"10.0.0.{i}"}, timeout=10
        )
        for i in range(1, 4)
    ]
    assert [a.status_code for a in spoofed] == [429, 429, 429]
