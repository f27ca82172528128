"""`writ policy check`: the decision a real call would get, for the caller and moment it names."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import yaml
from typer.testing import CliRunner

from gateway.calls.budgets import store_charges
from gateway.cli.main import app
from gateway.cli.policy_check import check_policy
from gateway.config import load_config
from gateway.errors import ConfigurationError
from store import Store
from tests.store.builders import call_request

RULES = [
    {"id": "agents-refund", "tools": ["refund"], "roles": ["approver"], "decision": "allow"},
    {
        "id": "no-writes-at-night",
        "tools": ["refund"],
        "when": "context.now.getHours('UTC') < 6",
        "decision": "deny",
        "reason": "outside_business_hours",
    },
    {
        "id": "loop",
        "tools": ["refund"],
        "when": "context.run_call_count >= 5",
        "decision": "deny",
        "reason": "too_many_calls",
    },
]


def config(tmp_path: Path, budgets: list[dict[str, object]] | None = None) -> str:
    path = tmp_path / "writ.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "store": {"url": f"sqlite:///{tmp_path / 'writ.db'}"},
                "backends": {"local": {"type": "python"}},
                "capabilities": [
                    {"id": "refund", "backend": "local", "callable": "tests.capabilities.sample_tools:add"}
                ],
                "policy": {"rules": RULES, "budgets": budgets or []},
            }
        )
    )
    return str(path)


def check(tmp_path: Path, *extra: str) -> str:
    args = ["policy", "check", "--sub", "bob", "--tool", "refund", "--args", '{"a": 1, "b": 2}']
    out = CliRunner().invoke(app, [*args, "-c", config(tmp_path), *extra])
    assert out.exit_code == 0, out.output
    return out.stdout


def test_roles_are_trimmed_as_writ_token_trims_them(tmp_path: Path) -> None:
    # `--roles "agent, approver"` checked the role " approver": denied, where the token is allowed.
    assert "decision: allow" in check(tmp_path, "--roles", "agent, approver", "--at", "2026-12-01T12:00Z")


def test_the_moment_and_the_run_call_count_a_rule_reads_can_be_given(tmp_path: Path) -> None:
    # context.now was always the present and run_call_count always 0: rules on them could not be tried.
    night = check(tmp_path, "--roles", "approver", "--at", "2026-12-01T03:00:00+00:00")
    looping = check(tmp_path, "--roles", "approver", "--at", "2026-12-01T12:00Z", "--run-call-count", "5")

    assert "reason: outside_business_hours" in night
    assert "reason: too_many_calls" in looping


def test_a_moment_without_an_offset_is_refused(tmp_path: Path) -> None:
    out = CliRunner().invoke(
        app,
        [
            "policy",
            "check",
            "--sub",
            "b",
            "--tool",
            "refund",
            "--at",
            "2026-12-01T03:00",
            "-c",
            config(tmp_path),
        ],
    )
    assert out.exit_code == 2 and "needs an offset" in out.output


def test_a_tool_only_an_mcp_upstream_would_list_is_said_to_be_untestable_here(tmp_path: Path) -> None:
    # "Unknown tool: 'read_file'" for a tool the running gateway serves read as a typo.
    path = Path(config(tmp_path))
    data = yaml.safe_load(path.read_text())
    data["backends"]["files"] = {"type": "mcp", "url": "http://127.0.0.1:9/mcp"}
    path.write_text(yaml.safe_dump(data))

    args = ["policy", "check", "--sub", "b", "--tool", "read_file", "-c", str(path)]
    out = CliRunner().invoke(app, args)

    assert isinstance(out.exception, ConfigurationError)  # `writ` prints it and exits 2
    assert "tools of MCP backends (files) are listed by the upstream only once a gateway runs" in str(
        out.exception
    )


def test_the_budgets_a_call_would_count_against_are_shown(tmp_path: Path) -> None:
    budgets: list[dict[str, object]] = [
        {"id": "refunds-an-hour", "tools": ["refund"], "window": "1h", "limit": 10},
        {"id": "spend", "measure": "spend", "amount": "args.a", "limit": 100, "scope": "tenant"},
        {"id": "other-tools", "tools": ["lookup"], "limit": 1},
    ]
    args = ["policy", "check", "--sub", "bob", "--roles", "approver", "--tool", "refund"]
    args += ["--args", '{"a": 7, "b": 2}', "--at", "2026-12-01T12:30Z"]
    out = CliRunner().invoke(app, [*args, "-c", config(tmp_path, budgets)])

    assert out.exit_code == 0, out.output
    assert "refunds-an-hour  principal default/bob  +1 of 10  resets 2026-12-01T13:00:00+00:00" in out.stdout
    assert "spend  tenant default  +7 of 100  resets 2026-12-02T00:00:00+00:00" in out.stdout
    budgets = out.stdout[out.stdout.index("budgets:") :]
    assert "other-tools" not in budgets  # it counts other tools than this call's
    # ... and names one no capability has, which `writ serve` refuses to start on: the check says so.
    assert "tool names: writ serve refuses to start: budget 'other-tools' names tool 'lookup'" in out.stdout


def test_a_resource_read_is_checked_by_its_uri_against_resource_rules(tmp_path: Path) -> None:
    path = Path(config(tmp_path))
    data = yaml.safe_load(path.read_text())
    data["backends"]["files"] = {
        "type": "mcp",
        "url": "http://127.0.0.1:9/mcp",
        "resources": {"uri_prefix": "f+"},
    }
    data["policy"]["rules"].append(
        {"id": "read-reports", "resources": ["f+file:///reports/*"], "roles": ["agent"], "decision": "allow"}
    )
    path.write_text(yaml.safe_dump(data))

    def check_read(uri: str) -> str:
        args = ["policy", "check", "--sub", "b", "--roles", "agent", "--resource", uri, "-c", str(path)]
        out = CliRunner().invoke(app, args)
        assert out.exit_code == 0, out.output
        return out.stdout

    allowed, denied = check_read("f+file:///reports/q3.pdf"), check_read("f+file:///payroll.csv")
    assert "decision: allow" in allowed and "rule: read-reports" in allowed
    assert "capability: files/resources@1" in allowed
    assert "decision: deny" in denied and "reason: no_matching_rule" in denied
    elsewhere = CliRunner().invoke(
        app, ["policy", "check", "--sub", "b", "--resource", "x://y", "-c", str(path)]
    )
    assert isinstance(elsewhere.exception, ConfigurationError)
    assert "no backend relays resources under 'x://y'" in str(elsewhere.exception)
    both = CliRunner().invoke(
        app, ["policy", "check", "--sub", "b", "--tool", "t", "--resource", "f+x", "-c", str(path)]
    )
    assert both.exit_code == 2 and "--tool NAME, or --resource URI" in both.output


def test_the_current_use_of_each_budget_is_read_from_the_store_without_creating_it(tmp_path: Path) -> None:
    budgets: list[dict[str, object]] = [
        {"id": "two-an-hour", "tools": ["refund"], "window": "1h", "limit": 2}
    ]
    path = config(tmp_path, budgets)
    args = ["policy", "check", "--sub", "bob", "--roles", "approver", "--tool", "refund"]
    args += ["--args", '{"a": 7, "b": 2}', "--at", "2026-12-01T12:30Z", "-c", path]

    before = CliRunner().invoke(app, args)
    assert before.exit_code == 0, before.output
    assert "+1 of 2  resets 2026-12-01T13:00:00+00:00  used 0" in before.stdout
    assert "nothing recorded yet" in before.stdout and not (tmp_path / "writ.db").exists()

    at = datetime.fromisoformat("2026-12-01T12:30:00+00:00")
    checked = check_policy(
        load_config(Path(path)), subject="bob", roles=["approver"], tool="refund", arguments={"a": 7}, now=at
    )
    with Store.open(f"sqlite:///{tmp_path / 'writ.db'}") as store:
        store.migrate()
        for n in range(2):
            request = call_request(
                tenant="default",
                subject="bob",
                idempotency_key=f"k{n}",
                charges=store_charges(checked.charges),
            )
            assert store.admit(request).owns_dispatch

    after = CliRunner().invoke(app, args)
    assert after.exit_code == 0, after.output
    assert "used 2  WOULD EXCEED: refused budget_exceeded" in after.stdout
