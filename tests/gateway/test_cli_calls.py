"""`writ calls list --unresolved` and `writ calls resolve`: a human settles what reconciliation could not."""

from __future__ import annotations

from pathlib import Path

import yaml
from typer.testing import CliRunner

from gateway.cli import app
from store import OutcomeRecord, Store
from tests.store.builders import NOW, call_request


def escalated_store(tmp_path: Path) -> Path:
    url = f"sqlite:///{tmp_path / 'writ.db'}"
    with Store.open(url) as store:
        store.migrate()
        store.admit(call_request(tool_call_id="tc-lost", idempotency_key="k-lost"))
        call = store.record_outcome("tc-lost", OutcomeRecord(kind="unknown"), token=1, now=NOW)
        leased = store.start_reconciliation(
            "tc-lost", expected_token=call.lease_token, method="lookup", owner="w", lease_s=5, now=NOW
        )
        store.escalate_reconciliation("tc-lost", token=leased.lease_token, reason="gave_up", now=NOW)
        store.admit(call_request(tool_call_id="tc-done", idempotency_key="k-done"))
        store.record_outcome("tc-done", OutcomeRecord(kind="completed"), token=1, now=NOW)
    config = tmp_path / "writ.yaml"
    config.write_text(yaml.safe_dump({"store": {"url": url}}))
    return config


def test_unresolved_lists_only_unknown_calls_and_marks_the_escalated_ones(tmp_path: Path) -> None:
    config = escalated_store(tmp_path)

    out = CliRunner().invoke(app, ["calls", "list", "--unresolved", "-c", str(config)])

    assert out.exit_code == 0, out.output
    assert "tc-lost" in out.output and "ESCALATED" in out.output
    assert "tc-done" not in out.output


def test_a_human_resolution_is_recorded_with_who_and_the_evidence(tmp_path: Path) -> None:
    config = escalated_store(tmp_path)

    out = CliRunner().invoke(
        app,
        [
            "calls",
            "resolve",
            "tc-lost",
            "--outcome",
            "failed",
            "--evidence",
            "no refund at the bank",
            "--by",
            "carol",
            "-c",
            str(config),
        ],
    )

    assert out.exit_code == 0, out.output
    assert "failed (confirmed_failure), resolved by carol" in out.output
    with Store.open(f"sqlite:///{tmp_path / 'writ.db'}") as store:
        event = store.events(tool_call_id="tc-lost")[-1]
    assert (event.type, event.producer) == ("reconciliation.resolved", "writ-cli")
    assert event.payload["resolved_by"] == "carol"
    again = CliRunner().invoke(
        app, ["calls", "resolve", "tc-lost", "--outcome", "failed", "--evidence", "x", "-c", str(config)]
    )
    assert again.exit_code == 1  # agreeing with a settled verdict records nothing
    disagree = CliRunner().invoke(
        app,
        [
            "calls",
            "resolve",
            "tc-lost",
            "--outcome",
            "succeeded",
            "--evidence",
            "r1 at the bank",
            "--by",
            "dave",
        ]
        + ["-c", str(config)],
    )
    assert disagree.exit_code == 0, disagree.output
    assert "tc-lost stays failed: contradicted by dave, recorded and escalated" in disagree.output
    listed = CliRunner().invoke(app, ["calls", "list", "--unresolved", "-c", str(config)])
    assert "CONTRADICTED" in listed.output and "tc-lost" in listed.output
