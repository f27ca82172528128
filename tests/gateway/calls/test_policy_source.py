"""The policy in force comes from a watched file: reloaded when it changes, at most once per interval,
and an invalid new file leaves the old policy in force."""

from __future__ import annotations

import json
import logging
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from capabilities.contract import Capability
from gateway.app import build_runtime
from gateway.calls.policy_source import WatchedPolicyFile, policy_provider, vet_tool_names
from gateway.cli.policy_check import check_policy
from gateway.config import WritConfig, load_config
from gateway.errors import ConfigurationError, UnknownTool
from policy.model import PolicyError
from policy.rules import PolicyConfig

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
ALLOW = {
    "rules": [{"id": "agents-refund", "tools": ["refund_order"], "roles": ["agent"], "decision": "allow"}]
}
DENY = {
    "rules": [
        {"id": "refunds-frozen", "tools": ["refund_order"], "decision": "deny", "reason": "refunds_frozen"}
    ]
}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def write(path: Path, policy: object, *, bump: int = 0) -> None:
    path.write_text(yaml.safe_dump(policy) if not isinstance(policy, str) else policy)
    stat = path.stat()
    # Distinct mtimes even on coarse file systems.
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + bump * 1_000_000_000))


def test_a_changed_file_is_picked_up_after_the_interval_and_not_before(tmp_path: Path) -> None:
    path, clock = tmp_path / "policy.yaml", Clock()
    write(path, ALLOW)
    source = WatchedPolicyFile(path, interval_s=1.0, clock=clock)
    first = source()
    write(path, DENY, bump=1)
    clock.now = 0.5
    assert source() is first
    clock.now = 1.5
    assert source().version != first.version
    assert source().config.rules[0].id == "refunds-frozen"


def test_a_file_renamed_over_it_with_the_same_size_and_mtime_is_picked_up(tmp_path: Path) -> None:
    # rsync -a or cp -p keep the source's mtime, and a new threshold often keeps the size: the stamp
    # (mtime, size) did not change, so the new policy never took effect.
    path, clock = tmp_path / "policy.yaml", Clock()
    rule = {"id": "big", "tools": ["refund_order"], "decision": "deny", "when": "double(args.amount) > {}"}
    write(path, {"rules": [{**rule, "when": rule["when"].format("100.0")}]})
    source = WatchedPolicyFile(path, interval_s=1.0, clock=clock)
    first = source()
    new = tmp_path / "policy.yaml.new"
    write(new, {"rules": [{**rule, "when": rule["when"].format("500.0")}]})
    old = path.stat()
    assert new.stat().st_size == old.st_size
    os.utime(new, ns=(old.st_atime_ns, old.st_mtime_ns))
    new.replace(path)

    clock.now = 1.5
    assert source().version != first.version
    assert "500.0" in (source().config.rules[0].when or "")


def test_an_invalid_new_file_is_logged_once_and_the_old_policy_stays(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path, clock = tmp_path / "policy.yaml", Clock()
    write(path, ALLOW)
    source = WatchedPolicyFile(path, interval_s=1.0, clock=clock)
    version = source().version
    write(path, "rules: [{id: broken, tools: [x], decision: allow, when: 'args.amount >'}]", bump=1)
    with caplog.at_level(logging.ERROR, logger="gateway.calls.policy_source"):
        for step in range(1, 4):
            clock.now = step * 1.5
            assert source().version == version
    assert len([r for r in caplog.records if "not loaded" in r.message]) == 1
    assert f"keeping policy {version}" in caplog.text
    write(path, DENY, bump=2)
    clock.now = 10
    assert source().version != version


def test_a_deleted_file_keeps_the_policy_in_force(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path, clock = tmp_path / "policy.yaml", Clock()
    write(path, ALLOW)
    source = WatchedPolicyFile(path, interval_s=1.0, clock=clock)
    version = source().version
    path.unlink()
    clock.now = 2
    with caplog.at_level(logging.ERROR, logger="gateway.calls.policy_source"):
        assert source().version == version
    assert "cannot read policy file" in caplog.text


def test_a_policy_file_that_does_not_load_at_start_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(PolicyError):
        policy_provider(PolicyConfig(), "missing.yaml", base_dir=tmp_path)


def test_inline_rules_and_a_policy_file_together_are_refused() -> None:
    with pytest.raises(ValueError, match="either policy"):
        WritConfig.model_validate({"policy": ALLOW, "policy_file": "p.yaml"})


def config_with_demo_capabilities(tmp_path: Path) -> WritConfig:
    text = (Path(__file__).parents[3] / "demo" / "demo.yaml").read_text()
    for name, value in {"gateway_port": "8080", "backend_port": "8081", "state_dir": str(tmp_path)}.items():
        text = text.replace("${" + name + "}", value)
    config = yaml.safe_load(text)
    del config["policy"]
    config["policy_file"] = "policy.yaml"
    (tmp_path / "writ.yaml").write_text(yaml.safe_dump(config))
    write(tmp_path / "policy.yaml", yaml.safe_load(text)["policy"])
    return load_config(tmp_path / "writ.yaml")


def test_policy_check_names_the_decision_reason_version_and_deciding_rule(tmp_path: Path) -> None:
    config = config_with_demo_capabilities(tmp_path)
    refund = {"order_id": "1", "amount": 250, "currency": "EUR", "reason": "x"}
    result = check_policy(
        config, subject="alice", roles=["agent"], tool="refund_order", arguments=refund, now=NOW
    )
    assert result.decision.effect == "require_approval"
    assert result.decision.rule_id == "refunds-over-100-need-approval"
    text = result.to_text()
    assert (
        "reason: amount_over_approval_threshold" in text
        and f"policy version: {result.decision.policy_version}" in text
    )
    assert "refunds-over-10000-denied" in text and "condition_false" in text
    denied = check_policy(config, subject="eve", roles=[], tool="refund_order", arguments=refund, now=NOW)
    assert json.loads(json.dumps(denied.to_json()))["reason"] == "no_matching_rule"
    with pytest.raises(UnknownTool):
        check_policy(config, subject="alice", roles=["agent"], tool="nope", arguments={}, now=NOW)


def demo_rules_with(tmp_path: Path, rule_id: str, **changes: Any) -> WritConfig:
    """The demo's config (its policy in a file), with one of its rules changed."""
    config = config_with_demo_capabilities(tmp_path)
    rules = yaml.safe_load((tmp_path / "policy.yaml").read_text())
    [changed] = [r for r in rules["rules"] if r["id"] == rule_id]
    changed.update(changes)
    write(tmp_path / "policy.yaml", rules, bump=1)
    return config


@pytest.mark.anyio
async def test_a_gateway_refuses_to_start_on_an_approval_rule_naming_a_tool_it_does_not_have(
    tmp_path: Path,
) -> None:
    # The rule that holds refunds over 100 for a person, misspelled: it would cover no call, and every
    # refund would run on the next rule's allow.
    runtime = build_runtime(
        demo_rules_with(tmp_path, "refunds-over-100-need-approval", tools=["refund_ordr"])
    )
    with pytest.raises(ConfigurationError) as refused:
        async with runtime.running():
            pytest.fail("the gateway started")
    message = str(refused.value)
    assert message.startswith(f"{tmp_path / 'writ.yaml'}: policy_file policy.yaml: rule")  # the file to fix
    assert (
        "rule 'refunds-over-100-need-approval' names tool 'refund_ordr', which no capability has" in message
    )
    assert "did you mean 'refund_order'" in message
    assert "write a glob" in message


@pytest.mark.anyio
async def test_an_allow_rule_or_a_glob_naming_no_tool_starts_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # An allow rule that covers nothing fails closed, and a glob may be written for tools an upstream
    # has yet to offer: both are said, neither refused.
    config = demo_rules_with(tmp_path, "agents-refund", tools=["refund_order", "notes_extra"])
    rules = yaml.safe_load((tmp_path / "policy.yaml").read_text())
    rules["rules"].insert(0, {"id": "no-notes", "tools": ["notes.*"], "decision": "deny"})
    write(tmp_path / "policy.yaml", rules, bump=2)
    with caplog.at_level(logging.WARNING, logger="gateway.calls.policy_source"):
        async with build_runtime(config).running():
            pass
    warned = [r.message for r in caplog.records if "covers no call until one does" in r.message]
    assert len(warned) == 2
    assert "rule 'no-notes' names tool 'notes.*'" in warned[0]  # in the policy's order
    assert "rule 'agents-refund' names tool 'notes_extra'" in warned[1]


def test_a_reloaded_file_with_a_misspelled_deny_rule_is_not_put_in_force(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    refund = Capability(
        id="refund-order", version="2", tool_name="refund_order", backend="acme", input_schema={}
    )
    path, clock = tmp_path / "policy.yaml", Clock()
    write(path, ALLOW)
    source = WatchedPolicyFile(
        path, interval_s=1.0, clock=clock, vet=lambda policy: vet_tool_names(policy, [refund])
    )
    version = source().version
    misspelled = {"rules": [{**DENY["rules"][0], "tools": ["refund_orders"]}, *ALLOW["rules"]]}
    write(path, misspelled, bump=1)
    clock.now = 1.5
    with caplog.at_level(logging.ERROR, logger="gateway.calls.policy_source"):
        assert source().version == version
    assert "rule 'refunds-frozen' names tool 'refund_orders'" in caplog.text
    assert f"keeping policy {version}" in caplog.text
    write(path, DENY, bump=2)
    clock.now = 3.0
    assert source().config.rules[0].id == "refunds-frozen"


def test_policy_check_says_what_writ_serve_will_say_of_a_misspelled_tool(tmp_path: Path) -> None:
    # `writ store migrate` cannot know an upstream's tools; `writ policy check` says before a deploy what
    # the gateway's start would refuse, where every tool is configured rather than discovered.
    config = demo_rules_with(tmp_path, "refunds-over-100-need-approval", tools=["refund_ordr"])
    refund = {"order_id": "1001", "amount": 5, "currency": "EUR", "reason": "r"}
    checked = check_policy(
        config, subject="alice", roles=["agent"], tool="refund_order", arguments=refund, now=NOW
    )
    [said] = checked.tool_names
    assert said.startswith("writ serve refuses to start: rule 'refunds-over-100-need-approval' names tool")
    assert "did you mean 'refund_order'" in said
    assert f"tool names: {said}" in checked.to_text()
    assert checked.to_json()["tool_names"] == [said]

    raw = yaml.safe_load((tmp_path / "writ.yaml").read_text())
    raw["backends"]["notes"] = {"type": "mcp", "url": "http://127.0.0.1:9/mcp"}
    (tmp_path / "writ.yaml").write_text(yaml.safe_dump(raw))
    revalidated = load_config(tmp_path / "writ.yaml")
    unknown = check_policy(
        revalidated, subject="alice", roles=["agent"], tool="refund_order", arguments=refund, now=NOW
    )
    assert unknown.tool_names == ("checked when `writ serve` starts and has discovered its upstreams' tools",)
