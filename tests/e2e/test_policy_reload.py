"""A running gateway follows its policy file: a change takes effect without a restart and the decision
records the version that made it; a broken file is logged and the policy in force stays."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from string import Template

import anyio
import httpx2
import pytest
import yaml

from tests.e2e.harness import REPO, Backend, Gateway, writ_gateway

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


def refund(amount: float = 20) -> dict[str, object]:
    return {"order_id": "1001", "amount": amount, "currency": "EUR", "reason": "damaged in transit"}


def demo_policy() -> dict:
    text = Template((REPO / "demo" / "demo.yaml").read_text())
    return yaml.safe_load(text.safe_substitute(gateway_port=1, backend_port=2, state_dir="/x"))["policy"]


@pytest.fixture
def watched(tmp_path: Path, backend: Backend) -> Iterator[Gateway]:
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(demo_policy()))
    overrides = {"policy": {"rules": []}, "policy_file": str(tmp_path / "policy.yaml")}
    with writ_gateway(tmp_path, backend, f"sqlite:///{tmp_path / 'writ.db'}", overrides=overrides) as g:
        yield g


async def test_a_changed_policy_file_applies_to_the_next_call_without_a_restart(
    watched: Gateway, backend: Backend
) -> None:
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
    assert "policy reloaded from" in (watched.workdir / "writ.log").read_text()
    assert len(backend.refunds()) == n - 1


async def test_a_broken_policy_file_is_logged_and_the_policy_in_force_stays(watched: Gateway) -> None:
    (watched.workdir / "policy.yaml").write_text("rules: [{id: broken, tools: [x], decision: maybe}]")
    log = watched.workdir / "writ.log"
    with anyio.fail_after(10):
        while "not loaded, keeping policy" not in log.read_text():
            await anyio.sleep(0.2)
            async with watched.client(watched.token("alice")) as client:
                result = await client.call_tool("lookup_order", {"order_id": "1001"})
                assert result.meta["writ/status"] == "completed"


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
