"""Any replica serves any step of a sign-in: two gateways in-process behind one public URL, on one
PostgreSQL database and one key file, take turns through /authorize, login, consent, /token and
refresh; a code raced at both is redeemed once, and a reuse seen at one ends the sign-in at both."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from tests.e2e.harness import free_port
from tests.gateway.mcp.inproc import Backend, Writ, acme, writ
from tests.gateway.oauth.flow import (
    Pkce,
    authorization_params,
    code_for,
    csrf_of,
    exchange,
    redirected,
    refresh,
    register,
    tools_list,
)
from tests.postgres import fresh_schema

pytestmark = pytest.mark.postgres

USERS = [{"subject": "demo-agent", "tenant": "acme", "roles": ["agent"]}]


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory, postgres_url: str) -> Iterator[tuple[Writ, Writ]]:
    """Two gateways (each on its own port) configured with one public URL, database and key file."""
    root: Path = tmp_path_factory.mktemp("replicas")
    section = {
        "enabled": True,
        "key_file": str(root / "shared-oauth-keys.json"),
        "login": {"type": "builtin", "users": USERS},
    }
    server = {"public_url": f"http://127.0.0.1:{free_port()}"}
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(fresh_schema(postgres_url, "writ_replicas"))
        backend: Backend = stack.enter_context(acme(tmp_path_factory.mktemp("acme")))
        a, b = (
            stack.enter_context(
                writ(
                    tmp_path_factory.mktemp(name),
                    backend,
                    url,
                    server=server,
                    auth={"authorization_server": section},
                )
            )
            for name in ("a", "b")
        )
        yield a, b


def test_each_step_of_a_sign_in_can_land_on_another_replica(replicas: tuple[Writ, Writ]) -> None:
    a, b = replicas
    client_id = register(a.url)["client_id"]
    pkce = Pkce.make()
    with httpx2.Client(timeout=10) as browser:  # cookies go by host, not port: one browser, two replicas
        page = browser.get(f"{a.url}/authorize", params=authorization_params(client_id, pkce))
        csrf = csrf_of(page.text)
        consent = browser.post(f"{b.url}/authorize/login", data={"csrf": csrf, "user": "0"})
        assert consent.status_code == 200, consent.text
        code = redirected(
            browser.post(f"{a.url}/authorize/consent", data={"csrf": csrf, "decision": "allow"})
        )
    tokens = exchange(b.url, client_id, code["code"], pkce.verifier).json()
    assert tools_list(a.mcp_url, tokens["access_token"]).status_code != 401
    assert tools_list(b.mcp_url, tokens["access_token"]).status_code != 401
    renewed = refresh(a.url, client_id, tokens["refresh_token"]).json()
    # The rotated-out token shown to the other replica is a reuse there: the sign-in ends at both.
    assert refresh(b.url, client_id, tokens["refresh_token"]).json()["error"] == "invalid_grant"
    assert refresh(a.url, client_id, renewed["refresh_token"]).json()["error"] == "invalid_grant"
    for replica in (a, b):
        assert tools_list(replica.mcp_url, renewed["access_token"]).status_code == 401


def test_a_code_raced_at_two_replicas_gives_tokens_once(replicas: tuple[Writ, Writ]) -> None:
    a, b = replicas
    client_id = register(b.url)["client_id"]
    pkce = Pkce.make()
    code = code_for(a.url, client_id, pkce)
    barrier = threading.Barrier(2)
    answers: list[httpx2.Response] = []

    def redeem(replica: Writ) -> None:
        barrier.wait()
        answers.append(exchange(replica.url, client_id, code, pkce.verifier))

    threads = [threading.Thread(target=redeem, args=(replica,)) for replica in (a, b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(answer.status_code for answer in answers) == [200, 400]
    won = next(answer for answer in answers if answer.status_code == 200).json()
    # The loser's redemption was a replay: the winner's tokens are revoked with the code.
    assert tools_list(a.mcp_url, won["access_token"]).status_code == 401
    assert refresh(b.url, client_id, won["refresh_token"]).json()["error"] == "invalid_grant"
