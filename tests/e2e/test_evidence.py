"""What the record holds, on both stores: no redacted value in clear, who decided with which roles, under
which policy a call was refused, and approvals bound to the contract.

Against the whole gateway and backend served in this process: the cases that keep to the module's
configuration share one per store (`evidence`); a case that rewrites its policy, stops its workers,
changes its capabilities between two gateways on one store or needs its own files opens its own
(`inproc.writ`). The gateway's log is read as records (caplog); the console case drives Chromium (e2e)."""

from __future__ import annotations

import copy
import json
import logging
import stat
from collections.abc import Iterator
from pathlib import Path
from string import Template
from typing import Any

import httpx2
import pytest
import sqlalchemy as sa
import yaml
from playwright.async_api import Browser, expect

from store import Store
from store.schema import held_arguments, metadata
from tests.e2e.harness import REPO, Backend, Gateway
from tests.e2e.test_console import logged_in
from tests.eventually import eventually
from tests.gateway.mcp import inproc

pytestmark = pytest.mark.anyio

CARD = "4111111111111111"
SECRET_REASON = "customer iban DE89370400440532013000"
CHARGE_CARD = {
    "id": "charge-card",
    "version": "1",
    "tool": "charge_card",
    "backend": "acme",
    "effect": "write",
    "input_schema": {
        "type": "object",
        "properties": {
            "card": {"type": "string", "pattern": "^tok_[a-z0-9]{8,}$"},
            "amount": {"type": "number"},
            "memo": {"type": "string"},
        },
        "required": ["card", "amount"],
        "maxProperties": 2,
    },
    "request": {"method": "POST", "path": "/refunds"},
    "redact": ["card"],
}


def demo() -> dict[str, Any]:
    text = Template((REPO / "demo" / "demo.yaml").read_text())
    return yaml.safe_load(text.safe_substitute(gateway_port=1, backend_port=2, state_dir="/x"))


def capabilities(**refund: Any) -> list[dict[str, Any]]:
    """The demo's capabilities with the refund's reason redacted (and `refund` set on it), plus a card."""
    caps = copy.deepcopy(demo()["capabilities"])
    for cap in caps:
        if cap["tool"] == "refund_order":
            cap["redact"] = ["reason"]
            cap.update(refund)
    return [*caps, CHARGE_CARD]


def policy(*extra: dict[str, Any]) -> dict[str, Any]:
    rules = demo()["policy"]["rules"]
    allow_cards = {"id": "agents-charge", "tools": ["charge_card"], "roles": ["agent"], "decision": "allow"}
    return {"rules": [*rules, allow_cards, *extra]}


def started(workdir: Path, backend: Backend, store_url: str, *, workers: bool = True, **refund: Any) -> Any:
    """The gateway on this store with the capabilities above, its policy in workdir/policy.yaml."""
    policy_file = workdir / "policy.yaml"
    if not policy_file.exists():
        policy_file.write_text(yaml.safe_dump(policy()))
    overrides: dict[str, Any] = {
        "capabilities": capabilities(**refund),
        "policy": {"rules": []},
        "policy_file": str(policy_file),
    }
    if not workers:
        overrides["workers"] = {"enabled": False}
    return inproc.writ(workdir, backend, store_url, overrides=overrides)


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[Backend]:
    """A case's own backend, served in this process."""
    with inproc.acme(tmp_path) as b:
        yield b


@pytest.fixture(scope="module")
def evidence(
    tmp_path_factory: pytest.TempPathFactory, inproc_backend: Backend, module_store_url: str
) -> Iterator[Gateway]:
    """The module's gateway on this store, for the cases that change nothing of its configuration."""
    with started(tmp_path_factory.mktemp("writ"), inproc_backend, module_store_url) as gateway:
        yield gateway


@pytest.fixture
def own_evidence(tmp_path: Path, backend: Backend, store_url: str) -> Iterator[Gateway]:
    """A gateway of the case's own, for a case that rewrites its policy file."""
    with started(tmp_path, backend, store_url) as gateway:
        yield gateway


def logged(caplog: pytest.LogCaptureFixture) -> str:
    """What was logged in this process while the case ran (INFO and up, as `writ serve` logs)."""
    return "\n".join(caplog.handler.format(record) for record in caplog.records)


def stored(store_url: str) -> str:
    """Every row of every table of the store, as text."""
    with Store.open(store_url) as store, store.engine.connect() as conn:
        return "\n".join(
            repr(tuple(row)) for table in metadata.sorted_tables for row in conn.execute(sa.select(table))
        )


def held_count(store_url: str) -> int:
    with Store.open(store_url) as store, store.engine.connect() as conn:
        return len(conn.execute(sa.select(held_arguments)).all())


def api(gateway: Gateway, method: str, path: str, token: str, **kwargs: Any) -> httpx2.Response:
    headers = {"Authorization": f"Bearer {token}"}
    return httpx2.request(method, f"{gateway.url}{path}", headers=headers, timeout=10, **kwargs)


async def request_refund(gateway: Gateway, key: str, amount: float = 250) -> dict[str, Any]:
    args = {"order_id": "1002", "amount": amount, "currency": "EUR", "reason": SECRET_REASON}
    async with gateway.client(gateway.token("alice")) as client:
        result = await client.call_tool("refund_order", args, meta={"writ/idempotencyKey": key})
    return dict(result.structured_content or {})


async def status_once_not(gateway: Gateway, tool_call_id: str, passing: set[str]) -> dict[str, Any]:
    """The call once its status is none of `passing` (bounded wait)."""
    admin = gateway.token("root", roles="admin")
    return await eventually(
        lambda: api(gateway, "GET", f"/api/calls/{tool_call_id}", admin).json(),
        lambda body: body["status"] not in passing,
        within_s=30,
    )


def events_of(store_url: str, tool_call_id: str) -> dict[str, Any]:
    with Store.open(store_url) as store:
        return {event.type: event for event in store.events(tool_call_id=tool_call_id)}


async def policy_reloaded(gateway: Gateway, rules: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gateway.calls.policy_source")
    before = logged(caplog).count("policy reloaded from")
    (gateway.workdir / "policy.yaml").write_text(yaml.safe_dump(rules))
    # The policy file is looked at when the policy is asked for: listing tools asks.
    async with gateway.client(gateway.token("alice")) as client:

        async def reloads() -> int:
            await client.list_tools()
            return logged(caplog).count("policy reloaded from")

        await eventually(reloads, lambda count: count > before)


# -- item 4: no redacted value in clear -----------------------------------------------------------------


async def test_a_card_number_failing_its_pattern_in_a_redacted_field_is_named_never_quoted(
    evidence: Gateway, module_store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    store_url = module_store_url
    caplog.set_level(logging.INFO)
    async with evidence.client(evidence.token("alice")) as client:
        # The pattern's error quoted the value; maxProperties' error quoted all the arguments.
        by_pattern = await client.call_tool("charge_card", {"card": CARD, "amount": 10})
        by_count = await client.call_tool("charge_card", {"card": CARD, "amount": 10, "memo": "x"})

    results = [r.model_dump_json(by_alias=True) for r in (by_pattern, by_count)]
    assert by_pattern.structured_content["reason"] == "invalid_arguments"
    assert "card" in results[0] and "pattern" in results[0] and "^tok_[a-z0-9]{8,}$" in results[0]
    assert "maxProperties" in results[1]
    exported = evidence.cli("audit", "export").stdout
    assert exported.count("invalid_arguments") >= 2  # both refusals are recorded...
    everywhere = {
        "results": "\n".join(results),
        "audit export": exported,
        "calls list": evidence.cli("calls", "list").stdout,
        "store": stored(store_url),
        "log": logged(caplog),
    }
    for where, text in everywhere.items():
        assert CARD not in text, where  # ...and none of them quotes the card


@pytest.mark.parametrize("settled_by", ["reconciliation", "resolution"])
async def test_held_arguments_are_released_when_an_approved_call_settles_after_an_unknown_outcome(
    tmp_path: Path, backend: Backend, store_url: str, settled_by: str
) -> None:
    # Held arguments keep redacted fields in clear; both ways an unknown outcome is settled kept them.
    by_hand = settled_by == "resolution"
    with started(tmp_path, backend, store_url, workers=not by_hand) as gateway:
        pending = await request_refund(gateway, f"held-{settled_by}")
        assert pending["status"] == "approval_pending"
        assert held_count(store_url) == 1
        backend.chaos(**({"hang": 1} if by_hand else {"drop_responses": 1}))
        bob = gateway.token("bob", roles="approver")
        approved = api(
            gateway,
            "POST",
            f"/api/approvals/{pending['approvalId']}/decision",
            bob,
            json={"decision": "approve"},
        )
        assert approved.status_code == 200, approved.text
        call_id = pending["toolCallId"]
        if by_hand:
            unknown = await status_once_not(gateway, call_id, {"approval_pending", "approved", "dispatching"})
            assert unknown["status"] == "result_unknown"
            body = {"outcome": "failed", "evidence": "no refund in the statement"}
            resolved = api(gateway, "POST", f"/api/calls/{call_id}/resolution", bob, json=body)
            assert resolved.status_code == 200, resolved.text
        settled = await status_once_not(
            gateway, call_id, {"approval_pending", "approved", "dispatching", "result_unknown"}
        )

    assert settled["status"] == ("failed" if by_hand else "completed")
    assert "reconciliation.resolved" in events_of(store_url, call_id) or by_hand
    assert held_count(store_url) == 0
    # Reconciled, the demo backend's record quotes the reason back: withheld by its digest.
    assert SECRET_REASON not in stored(store_url)


async def test_a_backend_echoing_a_redacted_argument_puts_it_neither_into_the_log_nor_the_answer(
    evidence: Gateway, module_store_url: str
) -> None:
    store_url = module_store_url
    # acme-payments answers a refund with its record, reason included: the log would keep it for good.
    args = {"order_id": "1002", "amount": 20, "currency": "EUR", "reason": SECRET_REASON}
    async with evidence.client(evidence.token("alice")) as client:
        done = await client.call_tool("refund_order", args, meta={"writ/idempotencyKey": "echo"})

    assert done.structured_content is not None and done.structured_content["reason"] == "[redacted:reason]"
    assert SECRET_REASON not in json.dumps(done.model_dump(mode="json"))
    assert SECRET_REASON not in stored(store_url)
    assert SECRET_REASON not in evidence.cli("audit", "export").stdout


# -- item 9: who decided, with what authority, under which policy --------------------------------------


async def test_a_call_refused_at_execution_records_the_deciders_roles_and_the_refusing_policy_and_rule(
    own_evidence: Gateway, store_url: str, backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    evidence = own_evidence
    pending = await request_refund(evidence, "refused-later")
    frozen = {
        "id": "refunds-frozen",
        "tools": ["refund_order"],
        "decision": "deny",
        "reason": "refunds_frozen",
    }
    await policy_reloaded(evidence, policy(frozen), caplog)
    bob = evidence.token("bob", roles="approver,auditor")
    decided = api(
        evidence,
        "POST",
        f"/api/approvals/{pending['approvalId']}/decision",
        bob,
        json={"decision": "approve"},
    )
    assert decided.status_code == 200, decided.text
    settled = await status_once_not(evidence, pending["toolCallId"], {"approval_pending", "approved"})
    now_denied = await request_refund(evidence, "refused-now")  # the version the current policy has

    assert settled["status"] == "denied"
    events = events_of(store_url, pending["toolCallId"])
    assert events["approval.granted"].payload["decided_by_roles"] == ["approver", "auditor"]
    refusal = events["tool_call.denied"]
    assert refusal.payload["reason"] == "refunds_frozen"
    assert refusal.payload["rule_id"] == "refunds-frozen"
    assert refusal.policy_version == now_denied["policyVersion"]
    assert refusal.policy_version != events["tool_call.requested"].policy_version
    assert backend.refunds("refused-later") == []


def test_the_sqlite_store_is_created_readable_by_its_owner_only(tmp_path: Path, backend: Backend) -> None:
    state = tmp_path / "state" / "db"
    with started(tmp_path, backend, f"sqlite:///{state / 'writ.db'}") as gateway:
        gateway.token("alice")  # the gateway has written the store (and the salt and the key) by now
        files = [
            state / "writ.db",
            state / "writ.db-wal",
            tmp_path / "redaction.salt",
            tmp_path / "dev-issuer.jwk",
        ]
        modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in files}
        dirs = {path.name: stat.S_IMODE(path.stat().st_mode) for path in (state, state.parent)}

    assert modes == dict.fromkeys(modes, 0o600)
    assert dirs == {"db": 0o700, "state": 0o700}


# -- item 10: an approval binds the contract -----------------------------------------------------------

CHANGED_SCHEMA = copy.deepcopy(next(c for c in demo()["capabilities"] if c["tool"] == "refund_order"))
CHANGED_SCHEMA["input_schema"]["properties"]["reason"]["maxLength"] = 400


async def test_a_pending_approval_whose_capability_contract_changed_under_the_same_version_is_refused(
    tmp_path: Path, backend: Backend, store_url: str
) -> None:
    with started(tmp_path, backend, store_url) as before:
        pending = await request_refund(before, "contract")
    # Restarted with the refund's schema changed and its version still "2".
    with started(tmp_path, backend, store_url, input_schema=CHANGED_SCHEMA["input_schema"]) as after:
        bob = after.token("bob", roles="approver")
        decided = api(
            after,
            "POST",
            f"/api/approvals/{pending['approvalId']}/decision",
            bob,
            json={"decision": "approve"},
        )
        assert decided.status_code == 200, decided.text
        settled = await status_once_not(after, pending["toolCallId"], {"approval_pending", "approved"})

    assert settled["status"] == "denied"
    assert settled["reason"] == "capability_changed"
    assert backend.refunds("contract") == []


@pytest.mark.e2e
async def test_the_console_tells_the_approver_the_contract_and_the_policy_changed_since_the_request(
    tmp_path: Path, backend: Backend, browser: Browser
) -> None:
    store_url = f"sqlite:///{tmp_path / 'writ.db'}"
    with started(tmp_path, backend, store_url) as before:
        pending = await request_refund(before, "console-contract")
        unchanged = await request_refund(before, "console-unchanged", amount=300)
    stricter = {"id": "no-refunds-on-sunday", "tools": ["refund_order"], "decision": "deny", "when": "false"}
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(policy(stricter)))
    with started(tmp_path, backend, store_url, input_schema=CHANGED_SCHEMA["input_schema"]) as after:
        page = await logged_in(browser, after, after.token("bob", roles="approver"))
        await page.goto(f"{after.url}/console/approvals/{pending['approvalId']}")
        notices = page.locator(f"article#{pending['approvalId']} .changed")
        await expect(notices).to_have_count(2)
        await expect(notices.nth(0)).to_contain_text("contract changed since the call was requested")
        await expect(notices.nth(0)).to_contain_text("capability_changed")
        await expect(notices.nth(1)).to_contain_text("policy changed since the call was requested")

        await page.locator("button.approve").click()
        await expect(page.locator("#call-status")).to_have_text("denied")
        await expect(page.locator("#timeline li[data-type='tool_call.denied']")).to_contain_text(
            "capability_changed"
        )
    # A call requested under the contract in force is shown without a notice of its contract.
    with started(tmp_path, backend, store_url) as again:
        page = await logged_in(browser, again, again.token("bob", roles="approver"))
        await page.goto(f"{again.url}/console/approvals/{unchanged['approvalId']}")
        notices = page.locator(f"article#{unchanged['approvalId']} .changed")
        await expect(notices).to_have_count(1)
        await expect(notices).to_contain_text("policy changed")
    assert backend.refunds("console-contract") == []
