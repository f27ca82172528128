"""Runs and idempotency keys belong to the principal that named them, and every identifier the store
cannot hold is refused at the edge with a clear answer: the official MCP client and the HTTP API
against the whole gateway served in this process (the CLI run by its own `main`), on SQLite and
PostgreSQL."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx2
import pytest
from joserfc import jws

from gateway.auth.dev_issuer import ALGORITHM, DevIssuer
from tests.e2e.harness import Backend, Gateway
from tests.e2e.test_http_edges import call_2026
from tests.gateway.mcp import inproc

pytestmark = pytest.mark.anyio

# Counts every call of the run, so a call counted into my run by someone else shows as a denial.
LONG_RUNS = {
    "id": "runs-of-three",
    "tools": ["refund_order"],
    "when": "context.run_call_count >= 3",
    "decision": "deny",
    "reason": "run_too_long",
}


# One gateway and backend per store for the module: each case names runs and keys of its own, and
# compares the backend's refunds and the call list with what they held before it.
@pytest.fixture(scope="module")
def scoped_gateway(
    tmp_path_factory: pytest.TempPathFactory, inproc_backend: Backend, module_store_url: str
) -> Iterator[Gateway]:
    workdir = tmp_path_factory.mktemp("writ")
    with inproc.writ(workdir, inproc_backend, module_store_url, extra_rules=[LONG_RUNS]) as g:
        yield g


@pytest.fixture
def gateway(scoped_gateway: Gateway) -> Gateway:
    return scoped_gateway


@pytest.fixture
def backend(inproc_backend: Backend) -> Backend:
    return inproc_backend


# Order 1002 (5000 EUR) can take every case's refunds; 1001 (120 EUR) would run out.
def refund(amount: float, order: str = "1002") -> dict[str, Any]:
    return {"order_id": order, "amount": amount, "currency": "EUR", "reason": "damaged in transit"}


def api(gateway: Gateway, path: str, token: str) -> httpx2.Response:
    return httpx2.get(f"{gateway.url}{path}", headers={"Authorization": f"Bearer {token}"}, timeout=10)


def minted(gateway: Gateway, **claims: Any) -> str:
    """A token of the gateway's own dev issuer: signed, for this resource, with any claims (their JSON
    escaped as ASCII, so it may carry what a real issuer's JSON may: NUL, an unpaired surrogate)."""
    issuer = DevIssuer.load_or_create(gateway.workdir / "dev-issuer.jwk", f"{gateway.url}/dev-issuer")
    now = int(time.time())
    body = {"iss": issuer.issuer, "aud": gateway.mcp_url, "iat": now, "exp": now + 600}
    body |= {"sub": "alice", "roles": ["agent"], "tenant": "acme", **claims}
    header = {"alg": ALGORITHM, "kid": issuer._key.kid, "typ": "at+jwt"}
    return jws.serialize_compact(header, json.dumps(body).encode(), issuer._key)


async def test_another_agent_naming_my_run_first_neither_reads_it_nor_counts_into_it(
    gateway: Gateway, backend: Backend
) -> None:
    bob, alice = gateway.token("bob"), gateway.token("alice")
    before = len(backend.refunds())
    async with gateway.client(bob) as client:
        for _ in range(3):
            squat = await client.call_tool("lookup_order", {"order_id": "1001"}, meta={"writ/runId": "daily"})
    async with gateway.client(alice) as client:
        mine = await client.call_tool("refund_order", refund(20), meta={"writ/runId": "daily"})
        again = await client.call_tool("refund_order", refund(30), meta={"writ/runId": "daily"})

    # Bob's three calls were not counted into Alice's run: her first two refunds ran.
    assert [r.meta["writ/status"] for r in (mine, again)] == ["completed", "completed"]
    assert len(backend.refunds()) == before + 2
    my_run = mine.meta["writ/runId"]
    assert my_run == again.meta["writ/runId"] != squat.meta["writ/runId"]
    my_calls = {mine.meta["writ/toolCallId"], again.meta["writ/toolCallId"]}

    # Bob reads his own run by the name, and Alice's by no name.
    his = api(gateway, "/api/runs/daily/events", bob)
    assert his.status_code == 200 and his.json()["runId"] == squat.meta["writ/runId"]
    assert not any(call in his.text for call in my_calls) and "damaged in transit" not in his.text
    assert api(gateway, f"/api/runs/{my_run}/events", bob).status_code == 404

    # Alice reads hers by the name her client gave it, and by Writ's id; an auditor by Writ's id.
    for path, token in [
        ("/api/runs/daily/events", alice),
        (f"/api/runs/{my_run}/events", alice),
        (f"/api/runs/{my_run}/events", gateway.token("ivy", roles="auditor")),
    ]:
        answer = api(gateway, path, token)
        assert answer.status_code == 200, path
        events = answer.json()["events"]
        assert {e["tool_call_id"] for e in events if e["type"] == "tool_call.requested"} == my_calls
        started = [e["payload"] for e in events if e["type"] == "run.started"]
        assert started == [
            {
                "tenant": "acme",
                "subject": "alice",
                "implicit": False,
                "client_run_id": "daily",
                "origin": "client",
            }
        ]


async def test_a_run_name_used_in_another_tenant_is_another_run_not_an_error(
    gateway: Gateway, backend: Backend
) -> None:
    before = len(backend.refunds())
    async with gateway.client(gateway.token("eve", tenant="globex")) as client:
        theirs = await client.call_tool("lookup_order", {"order_id": "1001"}, meta={"writ/runId": "nightly"})
    async with gateway.client(gateway.token("alice")) as client:
        mine = await client.call_tool("refund_order", refund(20), meta={"writ/runId": "nightly"})

    assert (theirs.meta["writ/status"], mine.meta["writ/status"]) == ("completed", "completed")
    assert theirs.meta["writ/runId"] != mine.meta["writ/runId"]
    assert len(backend.refunds()) == before + 1


async def test_another_agents_idempotency_key_neither_joins_nor_conflicts_with_mine(
    gateway: Gateway, backend: Backend
) -> None:
    before = len(backend.refunds())
    async with gateway.client(gateway.token("bob")) as client:
        his_same = await client.call_tool("refund_order", refund(20), meta={"writ/idempotencyKey": "k-1"})
        his_other = await client.call_tool("refund_order", refund(40), meta={"writ/idempotencyKey": "k-2"})
    async with gateway.client(gateway.token("alice")) as client:
        # The same key and arguments: joined Bob's call, so Alice was told his call's result.
        same = await client.call_tool("refund_order", refund(20), meta={"writ/idempotencyKey": "k-1"})
        # The same key, other arguments: refused as a conflict naming Bob's call.
        other = await client.call_tool("refund_order", refund(30), meta={"writ/idempotencyKey": "k-2"})
        # Her own key still binds her: the same key with other arguments conflicts with her call.
        mine_again = await client.call_tool("refund_order", refund(31), meta={"writ/idempotencyKey": "k-2"})

    assert [r.meta["writ/status"] for r in (same, other)] == ["completed", "completed"]
    his = {his_same.meta["writ/toolCallId"], his_other.meta["writ/toolCallId"]}
    assert not his & {same.meta["writ/toolCallId"], other.meta["writ/toolCallId"]}
    assert len(backend.refunds()) == before + 4
    conflict = mine_again.structured_content
    assert conflict["reason"] == "idempotency_conflict"
    assert not any(call in str(conflict) for call in his)


async def test_a_run_id_of_up_to_255_characters_names_a_run_on_both_stores(gateway: Gateway) -> None:
    alice = gateway.token("alice")
    for length in (128, 129, 255):
        name = "r" * length
        async with gateway.client(alice) as client:
            result = await client.call_tool(
                "refund_order", refund(20 + length % 7), meta={"writ/runId": name}
            )
        assert result.meta["writ/status"] == "completed", length
        events = api(gateway, f"/api/runs/{name}/events", alice)
        assert events.status_code == 200, length
        assert result.meta["writ/toolCallId"] in events.text


UNFIT_CLAIMS = [
    ({"sub": "alice", "tenant": "t" * 129}, "claim 'tenant' (the tenant) is 129 characters long"),
    ({"sub": "s" * 256}, "claim 'sub' (the subject) is 256 characters long"),
    ({"sub": "bob\x00"}, "claim 'sub' (the subject) contains a control"),
    ({"sub": "alice", "tenant": "acme\u202e"}, "claim 'tenant' (the tenant) contains a control, format"),
    ({"sub": "alice", "tenant": "acme\ud800"}, "unpaired surrogate"),
    ({"sub": "alice", "roles": ["agent", "r" * 256]}, "a name in claim 'roles' is 256 characters"),
    ({"sub": "alice", "client_id": "c\x00"}, "claim 'client_id' (the client id) contains a control"),
]


@pytest.mark.parametrize(("claims", "reason"), UNFIT_CLAIMS, ids=[r[:30] for _, r in UNFIT_CLAIMS])
def test_a_signed_token_with_a_claim_the_store_cannot_hold_gets_401_naming_it_and_records_nothing(
    gateway: Gateway, backend: Backend, claims: dict[str, Any], reason: str
) -> None:
    # On PostgreSQL each of these was a -32603 (or a 500 from the API) after Writ had begun the call;
    # on SQLite most were recorded, a tenant or subject no later read could name.
    token = minted(gateway, **claims)
    refunds, calls = backend.refunds(), gateway.recorded_calls()
    status, answer = call_2026(
        gateway, token, "refund_order", '{"order_id":"1001","amount":20,"currency":"EUR","reason":"r"}'
    )
    assert status == 401, answer
    assert answer["error"] == "invalid_token" and reason in answer["error_description"]
    approvals = api(gateway, "/api/approvals", token)
    assert approvals.status_code == 401 and reason in approvals.json()["error_description"]
    challenge = approvals.headers["www-authenticate"]
    assert challenge.isascii() and 'resource_metadata="' in challenge and "error_description=" in challenge
    assert backend.refunds() == refunds
    assert gateway.recorded_calls() == calls  # nothing recorded


async def test_a_tenant_and_subject_at_their_limits_are_served(gateway: Gateway, backend: Backend) -> None:
    token = minted(gateway, sub="s" * 255, tenant="t" * 128, roles=["agent", "x" * 255])
    async with gateway.client(token) as client:
        result = await client.call_tool("refund_order", refund(20), meta={"writ/runId": "r" * 255})
    assert result.meta["writ/status"] == "completed"
    call = api(gateway, f"/api/calls/{result.meta['writ/toolCallId']}", token).json()
    assert (call["subject"], call["tenant"]) == ("s" * 255, "t" * 128)
    assert "hash chain intact" in gateway.cli("audit", "verify").stdout


def test_the_api_refuses_a_subject_or_text_the_store_cannot_hold_with_400_and_the_limit(
    gateway: Gateway,
) -> None:
    admin = {"Authorization": f"Bearer {gateway.token('root', roles='admin,approver')}"}
    for subject, reason in [
        ("s" * 256, "256 characters long, over the limit of 255"),
        ("bob\u200b", "format"),
    ]:
        revoked = httpx2.post(
            f"{gateway.url}/api/principals/{quote(subject)}/revocation", json={}, headers=admin, timeout=10
        )
        assert revoked.status_code == 400, revoked.text
        assert revoked.json()["error"] == "invalid_request" and reason in revoked.json()["error_description"]
    resolved = httpx2.post(
        f"{gateway.url}/api/calls/tc_x/resolution",
        json={"outcome": "failed", "evidence": "ledger line 4\u0000"},
        headers=admin,
        timeout=10,
    )
    assert resolved.status_code == 400 and "NUL" in resolved.json()["error_description"]
    for path in ("/api/calls/" + "t" * 300, "/api/approvals/" + "a" * 300, f"/api/runs/{'r' * 300}/events"):
        assert httpx2.get(gateway.url + path, headers=admin, timeout=10).status_code == 404, path[:20]
    assert "principal.revoked" not in "".join(map(str, gateway.exported()))
    assert "hash chain intact" in gateway.cli("audit", "verify").stdout


def test_the_cli_refuses_a_subject_or_tenant_the_store_cannot_hold_and_names_the_limit(
    gateway: Gateway,
) -> None:
    cases = [
        (("token", "--sub", "s" * 256, "--roles", "agent"), "--sub is 256 characters long"),
        (("token", "--sub", "alice", "--tenant", "t" * 129), "--tenant is 129 characters long"),
        (("token", "--sub", "alice", "--roles", "agent,\u202eadmin"), "a name in --roles contains"),
        (("principals", "revoke", "s" * 256, "--tenant", "acme"), "SUB is 256 characters long"),
        (("principals", "revoke", "bob", "--tenant", "t" * 129), "--tenant is 129 characters long"),
        # A decider or resolver is no longer typed (`--as`, `--by` are refused): it is a verified
        # token's subject, whose claims are held to the same limits at verification, or the operator.
    ]
    for args, message in cases:
        done = gateway.cli(*args, check=False)
        assert done.returncode != 0 and message in done.stderr, (args[:2], done.stderr[-300:])
    assert "principal.revoked" not in gateway.exported()
