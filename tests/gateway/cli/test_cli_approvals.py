"""`writ approvals show`: an approval, the action it is bound to, and the decision that asked for it."""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta
from pathlib import Path

import yaml
from typer.testing import CliRunner

from gateway.cli.main import app
from store import Store
from tests.store.builders import NOW, REQUIRE_APPROVAL, call_request


def test_show_gives_the_action_and_the_rule_its_reason_and_message_as_recorded(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'writ.db'}"
    decision = dataclasses.replace(
        REQUIRE_APPROVAL,
        rule_id="refunds-over-100-need-approval",
        message="Refunds over 100 need a second pair of eyes.",
        also_matched=("agents-refund",),
    )
    with Store.open(url) as store:
        store.migrate()
        request = call_request(
            tool_call_id="tc-big",
            idempotency_key="k-big",
            decision=decision,
            approval_id="ap_big",
            approval_expires_at=NOW + timedelta(hours=1),
        )
        admitted = store.admit(request)
    approval_id = admitted.call.approval_id
    assert approval_id is not None
    config = tmp_path / "writ.yaml"
    config.write_text(yaml.safe_dump({"store": {"url": url}}))

    shown = CliRunner().invoke(app, ["approvals", "show", approval_id, "-c", str(config)])

    assert shown.exit_code == 0, shown.output
    body = json.loads(shown.output)
    assert (body["approval_id"], body["tool_call_id"], body["effect"]) == (
        approval_id,
        "tc-big",
        "refund 250.00 EUR to order 1001",
    )
    assert body["decision"]["effect"] == "require_approval"
    assert body["decision"]["rule_id"] == "refunds-over-100-need-approval"
    assert body["decision"]["reason"] == "amount_over_100"
    assert body["decision"]["message"] == "Refunds over 100 need a second pair of eyes."
    assert body["decision"]["also_matched"] == ["agents-refund"]


def test_show_of_an_approval_that_does_not_exist_exits_1(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'writ.db'}"
    with Store.open(url) as store:
        store.migrate()
    config = tmp_path / "writ.yaml"
    config.write_text(yaml.safe_dump({"store": {"url": url}}))

    shown = CliRunner().invoke(app, ["approvals", "show", "ap_nothing", "-c", str(config)])

    assert shown.exit_code == 1
    assert "no approval 'ap_nothing'" in shown.output
