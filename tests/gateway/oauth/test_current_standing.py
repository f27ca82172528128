"""A sign-in at Writ's authorization server speaks for the person as they stand now, not as they stood
when they signed in: a refresh asks the built-in login's configuration again (a user removed is
refused, changed roles are carried), a sign-in older than `sign_in_max_age_s` is refused, and a
principal revoked at any point of a sign-in gets no code and no token, then or after a restore.
The real gateway in process on both stores, restarted on a changed configuration as an operator would."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx2
import pytest
import yaml
from sqlalchemy import select

from store.commands import RestorePrincipal, RevokePrincipal
from store.oauth import Grantee
from store.schema import oauth_families
from tests.e2e.harness import Backend, demo_config, free_port
from tests.gateway.mcp.inproc import Writ, acme, served
from tests.gateway.oauth.flow import (
    Pkce,
    authorization_params,
    code_grant,
    csrf_of,
    exchange,
    redirected,
    refresh,
    register,
    sign_in,
    tools_list,
)
from tests.gateway.oauth.test_security_events import refusals
from tests.postgres import module_store_url

AGENT = {"subject": "demo-agent", "tenant": "acme", "roles": ["agent"]}
APPROVER = {"subject": "demo-approver", "tenant": "acme", "roles": ["approver"]}
RILEY = {"subject": "riley", "tenant": "acme", "roles": ["approver"]}
"""Revoked and restored by the cases here, and by no one else."""


store_url = module_store_url("writ_standing")


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    with acme(tmp_path_factory.mktemp("acme")) as served_backend:
        yield served_backend


class Deployment:
    """One Writ configuration file, served again after each change, as `writ serve -c` would be."""

    def __init__(self, workdir: Path, backend: Backend, store_url: str) -> None:
        self.workdir = workdir
        overrides = {"audit": {"security_events": {"window_s": 3600}}}
        self.path = demo_config(
            workdir,
            gateway_port=free_port(),
            backend_url=backend.url,
            store_url=store_url,
            overrides=overrides,
        )

    def users(self, *users: dict[str, Any]) -> Deployment:
        config = yaml.safe_load(self.path.read_text())
        config["auth"]["authorization_server"]["login"]["users"] = list(users)
        self.path.write_text(yaml.safe_dump(config, sort_keys=False))
        return self

    @contextlib.contextmanager
    def serving(self) -> Iterator[Writ]:
        with served(self.path, self.workdir) as gateway:
            yield gateway


@pytest.fixture
def deployment(tmp_path: Path, backend: Backend, store_url: str) -> Deployment:
    return Deployment(tmp_path, backend, store_url)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, backend: Backend, store_url: str) -> Iterator[Writ]:
    """One gateway for the cases that need no restart, with `riley` among its users (number 2)."""
    deployment = Deployment(tmp_path_factory.mktemp("writ"), backend, store_url)
    with deployment.users(AGENT, APPROVER, RILEY).serving() as served_gateway:
        yield served_gateway


def signed_in_as(gateway: Writ, client_id: str, user: int) -> dict[str, Any]:
    """The token response of a whole sign-in as user number `user`."""
    pkce = Pkce.make()
    code = redirected(sign_in(gateway.url, authorization_params(client_id, pkce), user=user))["code"]
    response = exchange(gateway.url, client_id, code, pkce.verifier)
    assert response.status_code == 200, response.text
    tokens: dict[str, Any] = response.json()
    return tokens


def claims_of(gateway: Writ, access_token: str) -> dict[str, Any]:
    server = gateway.runtime.authorization_server
    assert server is not None
    claims = server.own_access_token(access_token)
    assert claims is not None
    return claims


def refused(response: httpx2.Response) -> str:
    """The error of a refused token request, with its description: `invalid_grant: ...`."""
    assert response.status_code == 400, response.text
    body = response.json()
    return f"{body['error']}: {body.get('error_description', '')}"


def family_of(gateway: Writ, access_token: str) -> Any:
    with gateway.runtime.store.engine.connect() as conn:
        sid = claims_of(gateway, access_token)["sid"]
        return conn.execute(select(oauth_families).where(oauth_families.c.family_id == sid)).one()


def test_a_user_removed_from_the_config_cannot_refresh_after_a_restart(deployment: Deployment) -> None:
    with deployment.users(AGENT, APPROVER).serving() as gateway:
        client_id = str(register(gateway.url)["client_id"])
        tokens = signed_in_as(gateway, client_id, user=1)
        assert claims_of(gateway, tokens["access_token"])["roles"] == ["approver"]

    with deployment.users(AGENT).serving() as gateway:
        answer = refused(refresh(gateway.url, client_id, tokens["refresh_token"]))
        assert answer == "invalid_grant: demo-approver can no longer sign in here; the sign-in is ended"
        ended = family_of(gateway, tokens["access_token"])
        assert ended.revoked_at is not None and ended.revoked_reason == "login_user_removed"
        # The sign-in is over: its access token too, and its refresh token says so again.
        assert tools_list(gateway.mcp_url, tokens["access_token"]).status_code == 401
        assert refused(refresh(gateway.url, client_id, tokens["refresh_token"])).startswith("invalid_grant")
        # The users still configured refresh as before.
        other = signed_in_as(gateway, client_id, user=0)
        assert refresh(gateway.url, client_id, other["refresh_token"]).status_code == 200


def test_a_refresh_after_a_restart_carries_the_roles_and_groups_the_config_gives_now(
    deployment: Deployment,
) -> None:
    with deployment.users(AGENT, APPROVER).serving() as gateway:
        client_id = str(register(gateway.url)["client_id"])
        tokens = signed_in_as(gateway, client_id, user=1)

    demoted = APPROVER | {"roles": ["agent"], "groups": ["support"]}
    with deployment.users(AGENT, demoted).serving() as gateway:
        renewed = refresh(gateway.url, client_id, tokens["refresh_token"])
        assert renewed.status_code == 200, renewed.text
        claims = claims_of(gateway, renewed.json()["access_token"])
        assert (claims["sub"], claims["tenant"]) == ("demo-approver", "acme")
        assert (claims["roles"], claims["groups"]) == (["agent"], ["support"])
        # The rotated refresh token carries them on (the old one is still a reuse).
        again = refresh(gateway.url, client_id, renewed.json()["refresh_token"])
        assert again.status_code == 200, again.text
        assert claims_of(gateway, again.json()["access_token"])["roles"] == ["agent"]


def test_a_refresh_of_a_sign_in_older_than_sign_in_max_age_is_refused_every_time(gateway: Writ) -> None:
    client_id = str(register(gateway.url)["client_id"])
    pkce = Pkce.make()
    now = gateway.runtime.clock()
    signed_in = now - timedelta(seconds=86400 + 60)  # the default sign_in_max_age_s, and a minute
    grant = code_grant(
        gateway.mcp_url,
        client_id,
        pkce,
        Grantee("demo-agent", "acme", ("agent",)),
        expires_at=now + timedelta(seconds=60),
        auth_time=signed_in,
    )
    gateway.runtime.store.issue_code("an-old-sign-in", grant, now=signed_in)
    tokens = exchange(gateway.url, client_id, "an-old-sign-in", pkce.verifier).json()
    for _ in range(2):  # not used up: the same answer, never a reuse that would look like theft
        answer = refused(refresh(gateway.url, client_id, tokens["refresh_token"]))
        assert answer == "invalid_grant: the sign-in this refresh token belongs to is too old: sign in again"
    assert refusals(gateway, "refresh_reused", client_id=client_id) == []


def test_a_principal_revoked_between_login_and_consent_gets_no_code(gateway: Writ) -> None:
    client_id = str(register(gateway.url)["client_id"])
    store = gateway.runtime.store
    with httpx2.Client(base_url=gateway.url, timeout=10) as browser:
        page = browser.get("/authorize", params=authorization_params(client_id, Pkce.make()))
        csrf = csrf_of(page.text)
        consent = browser.post("/authorize/login", data={"csrf": csrf, "user": "2"})
        assert consent.status_code == 200 and "/authorize/consent" in consent.text
        # The page tells how long the sign-in lasts: refreshed while used, at most a day (the defaults).
        assert (
            "renewed without asking while it is used at least every 30 days, for at most 1 day from this "
            "sign-in (then you sign in again), until revoked"
        ) in consent.text
        store.revoke_principal(
            RevokePrincipal("acme", "riley", revoked_by="root", now=gateway.runtime.clock())
        )
        try:
            allowed = browser.post("/authorize/consent", data={"csrf": csrf, "decision": "allow"})
        finally:
            store.restore_principal(
                RestorePrincipal("acme", "riley", restored_by="root", now=gateway.runtime.clock())
            )
    assert allowed.status_code == 403 and "location" not in allowed.headers
    assert "riley is revoked in tenant acme; an admin can restore them" in allowed.text
    with store.engine.connect() as conn:
        families = conn.execute(select(oauth_families).where(oauth_families.c.client_id == client_id)).all()
    assert families == []  # no code, so no sign-in


def test_a_code_issued_before_the_revocation_is_refused_at_the_exchange(gateway: Writ) -> None:
    client_id = str(register(gateway.url)["client_id"])
    pkce = Pkce.make()
    code = redirected(sign_in(gateway.url, authorization_params(client_id, pkce), user=2))["code"]
    store, clock = gateway.runtime.store, gateway.runtime.clock
    store.revoke_principal(RevokePrincipal("acme", "riley", revoked_by="root", now=clock()))
    try:
        answer = refused(exchange(gateway.url, client_id, code, pkce.verifier))
    finally:
        store.restore_principal(RestorePrincipal("acme", "riley", restored_by="root", now=clock()))
    assert answer == "invalid_grant: the grant this code belongs to was revoked"


def test_no_token_made_around_a_revocation_works_after_the_restore(gateway: Writ) -> None:
    client_id = str(register(gateway.url)["client_id"])
    store, clock = gateway.runtime.store, gateway.runtime.clock
    before = signed_in_as(gateway, client_id, user=2)
    store.revoke_principal(RevokePrincipal("acme", "riley", revoked_by="root", now=clock()))
    # Two consents that passed their standing check an instant before the revocation committed: their
    # codes reach the store after it. One is exchanged while riley is revoked, one after the restore.
    at_once, later = Pkce.make(), Pkce.make()
    for code, pkce in (("exchanged-while-revoked", at_once), ("kept-until-restored", later)):
        grant = code_grant(
            gateway.mcp_url,
            client_id,
            pkce,
            Grantee("riley", "acme", ("approver",)),
            expires_at=clock() + timedelta(seconds=60),
            auth_time=clock(),
        )
        store.issue_code(code, grant, now=clock())
    while_revoked = exchange(gateway.url, client_id, "exchanged-while-revoked", at_once.verifier)
    assert refused(while_revoked) == "invalid_grant: the principal this code speaks for is revoked"
    assert refusals(gateway, "grant_revoked", 1, client_id=client_id)

    store.restore_principal(RestorePrincipal("acme", "riley", restored_by="root", now=clock()))

    after = exchange(gateway.url, client_id, "kept-until-restored", later.verifier)
    assert refused(after) == "invalid_grant: the grant this code belongs to was revoked"
    assert refused(refresh(gateway.url, client_id, before["refresh_token"])).startswith("invalid_grant")
    assert tools_list(gateway.mcp_url, before["access_token"]).status_code == 401
    # What the README promises: a restored principal signs in again.
    again = signed_in_as(gateway, client_id, user=2)
    assert refresh(gateway.url, client_id, again["refresh_token"]).status_code == 200
