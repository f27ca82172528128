"""A running gateway follows its policy file: a change takes effect without a restart and the decision
records the version that made it; a broken file is logged and the policy in force stays. The gateway is
served in this process (`inproc.writ`, one per case, since a case rewrites its policy file), its log read
as records (caplog), the CLI run by its own `main`."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from string import Template

import anyio
import httpx2
import pytest
import yaml

from tests.e2e.harness import REPO, Backend, Gateway
from tests.gateway.mcp import inproc

pytestmark = pytest.mark.anyio

POLICY_LOG = "gateway.calls.policy_source"


def refund(amount: float = 20) -> dict[str, object]:
    return {"order_id": "1001", "amount": amount, "currency": "EUR", "reason": "damaged in transit"}


def demo_policy() -> dict:
    text = Template((REPO / "demo" / "demo.yaml").read_text())
    return yaml.safe_load(text.safe_substitute(gateway_port=1, backend_port=2, state_dir="/x"))["policy"]


@pytest.fixture
def watched(tmp_path: Path, inproc_sqlite_backend: Backend) -> Iterator[Gateway]:
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(demo_policy()))
    overrides = {"policy": {"rules": []}, "policy_file": str(tmp_path / "policy.yaml")}
    store_url = f"sqlite:///{tmp_path / 'writ.db'}"
    with inproc.writ(tmp_path, inproc_sqlite_backend, store_url, overrides=overrides) as g:
        yield g


def logged(caplog: pytest.LogCaptureFixture) -> str:
    """What the policy source logged during the case."""
    return "\n".join(r.getMessage() for r in caplog.records if r.name == POLICY_LOG)


async def test_a_changed_policy_file_applies_to_the_next_call_without_a_restart(
    watched: Gateway, inproc_sqlite_backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    backend = inproc_sqlite_backend
    caplog.set_level(logging.INFO, logger=POLICY_LOG)
    refunds = len(backend.refunds())
    async with watched.client(watched.token("alice")) as client:
        allowed = await client.call_tool("refund_order", refund(), meta={"writ/idempotencyKey": "k1"})
        assert allowed.meta["writ/status"] == "completed"
        policy = demo_policy()
        policy["rules"].append(
            {
                "id": "refunds-frozen",
                "tools": ["refund_order"],
                "decision": "deny",
                "reason": "refunds_frozen",
            }
        )
        (watched.workdir / "policy.yaml").write_text(yaml.safe_dump(policy))
        with anyio.fail_after(10):
            n = 1
            while True:
                n += 1
                result = await client.call_tool(
                    "refund_order", refund(), meta={"writ/idempotencyKey": f"k{n}"}
                )
                if result.structured_content.get("status") == "denied":
                    break
                await anyio.sleep(0.2)
    assert result.structured_content["reason"] == "refunds_frozen"
    admin = watched.token("root", roles="admin")
    first = httpx2.get(
        f"{watched.url}/api/calls/{allowed.meta['writ/toolCallId']}",
        headers={"Authorization": f"Bearer {admin}"},
        timeout=5,
    ).json()
    assert result.structured_content["policyVersion"] != first["policyVersion"]
    assert "policy reloaded from" in logged(caplog)
    assert len(backend.refunds()) == refunds + n - 1


async def test_a_broken_policy_file_is_logged_and_the_policy_in_force_stays(
    watched: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=POLICY_LOG)
    (watched.workdir / "policy.yaml").write_text("rules: [{id: broken, tools: [x], decision: maybe}]")
    with anyio.fail_after(10):
        while "not loaded, keeping policy" not in logged(caplog):
            await anyio.sleep(0.2)
            async with watched.client(watched.token("alice")) as client:
                result = await client.call_tool("lookup_order", {"order_id": "1001"})
                assert result.meta["writ/status"] == "completed"


async def test_a_policy_file_is_looked_at_between_calls_too(
    watched: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    # An operator who `mv`s a new file in learns at once whether it loaded, not at the next call.
    caplog.set_level(logging.INFO, logger=POLICY_LOG)
    policy = demo_policy()
    policy["rules"].append({"id": "no-lookups", "tools": ["lookup_order"], "decision": "deny"})
    (watched.workdir / "policy.new").write_text(yaml.safe_dump(policy))
    (watched.workdir / "policy.new").rename(watched.workdir / "policy.yaml")
    with anyio.fail_after(10):
        while "policy reloaded from" not in logged(caplog):
            await anyio.sleep(0.1)
    (watched.workdir / "policy.yaml").write_text("rules: [{id: broken, tools: [x], decision: maybe}]")
    with anyio.fail_after(10):
        while "not loaded, keeping policy" not in logged(caplog):
            await anyio.sleep(0.1)


def test_writ_policy_check_prints_the_decision_and_the_rule_that_made_it(watched: Gateway) -> None:
    out = watched.cli(
        "policy",
        "check",
        "--sub",
        "alice",
        "--roles",
        "agent",
        "--tenant",
        "acme",
        "--tool",
        "refund_order",
        "--args",
        '{"order_id": "1", "amount": 20000, "currency": "EUR", "reason": "x"}',
    ).stdout
    assert "decision: deny" in out and "reason: amount_over_limit" in out
    assert "rule: refunds-over-10000-denied" in out and "policy version: p-" in out
    bad = watched.cli("policy", "check", "--sub", "a", "--tool", "refund_order", "--args", "[", check=False)
    assert bad.returncode == 2 and "--args is not JSON" in bad.stderr
