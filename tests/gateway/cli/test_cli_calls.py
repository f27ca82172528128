"""`writ calls list --unresolved` and `writ calls resolve`: a human settles what reconciliation could not."""

from __future__ import annotations

import getpass
import json
import socket
from pathlib import Path

import yaml
from click.testing import Result
from typer.testing import CliRunner

from gateway.cli.main import app
from gateway.config import load_config
from gateway.opening import dev_issuer_for
from store import Store
from store.commands import EscalateReconciliation, RevokePrincipal, StartReconciliation
from store.keys import scoped_key
from store.model import StoredEvent
from tests.store.builders import NOW, REQUIRE_APPROVAL, call_request, outcome


def escalated_store(tmp_path: Path) -> Path:
    url = f"sqlite:///{tmp_path / 'writ.db'}"
    with Store.open(url) as store:
        store.migrate()
        store.admit(call_request(tool_call_id="tc-lost", idempotency_key="k-lost"))
        call = store.record_outcome(outcome("tc-lost", "unknown", now=NOW))
        leased = store.start_reconciliation(
            StartReconciliation(
                "tc-lost", expected_token=call.lease_token, method="lookup", owner="w", lease_s=5, now=NOW
            )
        )
        store.escalate_reconciliation(
            EscalateReconciliation("tc-lost", token=leased.lease_token, reason="gave_up", now=NOW)
        )
        store.admit(call_request(tool_call_id="tc-done", idempotency_key="k-done"))
        store.record_outcome(outcome("tc-done", "completed", now=NOW))
    config = tmp_path / "writ.yaml"
    dev_issuer = {"enabled": True, "key_file": str(tmp_path / "dev-issuer.jwk")}
    config.write_text(yaml.safe_dump({"store": {"url": url}, "auth": {"dev_issuer": dev_issuer}}))
    return config


def token(config: Path, sub: str, roles: list[str], tenant: str = "acme") -> str:
    """A real JWT from the config's development issuer, for the gateway this config describes."""
    cfg = load_config(config)
    issuer = dev_issuer_for(cfg)
    assert issuer is not None
    return issuer.mint(
        subject=sub, audience=cfg.server.resource_url, tenant=tenant, roles=roles, scopes=[], ttl_s=300
    )


def resolve(
    config: Path,
    *args: str,
    env: dict[str, str] | None = None,
    outcome: str = "failed",
    evidence: str = "no refund",
) -> Result:
    return CliRunner().invoke(
        app,
        [
            "calls",
            "resolve",
            "tc-lost",
            "--outcome",
            outcome,
            "--evidence",
            evidence,
            *args,
            "-c",
            str(config),
        ],
        env={"WRIT_TOKEN": "", **(env or {})},
    )


def last_event(tmp_path: Path) -> StoredEvent:
    with Store.open(f"sqlite:///{tmp_path / 'writ.db'}") as store:
        return store.events(tool_call_id="tc-lost")[-1]


def test_unresolved_lists_only_unknown_calls_and_marks_the_escalated_ones(tmp_path: Path) -> None:
    config = escalated_store(tmp_path)

    out = CliRunner().invoke(app, ["calls", "list", "--unresolved", "-c", str(config)])

    assert out.exit_code == 0, out.output
    assert "tc-lost" in out.output and "ESCALATED" in out.output
    assert "tc-done" not in out.output


def test_show_gives_the_key_as_the_backend_got_it_beside_the_clients_and_none_before_it_was_sent(
    tmp_path: Path,
) -> None:
    config = escalated_store(tmp_path)
    with Store.open(f"sqlite:///{tmp_path / 'writ.db'}") as store:
        store.admit(
            call_request(tool_call_id="tc-waiting", idempotency_key="k-waiting", decision=REQUIRE_APPROVAL)
        )

    shown = {
        tool_call_id: json.loads(
            CliRunner().invoke(app, ["calls", "show", tool_call_id, "-c", str(config)]).output
        )
        for tool_call_id in ("tc-lost", "tc-waiting")
    }

    lost, waiting = shown["tc-lost"], shown["tc-waiting"]
    assert (lost["idempotencyKey"], lost["backendKey"]) == ("k-lost", scoped_key("acme", "alice", "k-lost"))
    assert (waiting["idempotencyKey"], waiting["backendKey"]) == ("k-waiting", None)


def test_a_value_in_a_summary_cannot_add_a_row_to_a_list(tmp_path: Path) -> None:
    config = escalated_store(tmp_path)
    forged = "\nap_fake  awaiting_approval  call=tc-fake  refund 5.00 EUR to order 1001"
    with Store.open(f"sqlite:///{tmp_path / 'writ.db'}") as store:
        store.admit(
            call_request(
                tool_call_id="tc-odd",
                idempotency_key="k-odd",
                decision=REQUIRE_APPROVAL,
                summary=f"refund 250.00 EUR to order 1002\ufe0f{forged}",
            )
        )

    calls = CliRunner().invoke(app, ["calls", "list", "-c", str(config)])
    approvals = CliRunner().invoke(app, ["approvals", "list", "-c", str(config)])

    assert calls.exit_code == 0 and approvals.exit_code == 0, calls.output + approvals.output
    assert len(calls.output.splitlines()) == 3 and len(approvals.output.splitlines()) == 1
    for listed in (calls.output, approvals.output):
        assert "order 1002<U+FE0F><U+000A>ap_fake" in listed
        assert not any(line.startswith("ap_fake") for line in listed.splitlines())


def test_a_resolution_with_a_token_is_recorded_under_the_tokens_subject(tmp_path: Path) -> None:
    config = escalated_store(tmp_path)

    out = resolve(config, "--token", token(config, "carol", ["approver"]))

    assert out.exit_code == 0, out.output
    assert "failed (confirmed_failure), resolved by carol" in out.output
    event = last_event(tmp_path)
    assert (event.type, event.producer) == ("reconciliation.resolved", "writ-cli")
    assert (event.payload["resolved_by"], event.payload["break_glass"]) == ("carol", False)
    again = resolve(config, "--token", token(config, "carol", ["approver"]))
    assert again.exit_code == 1  # agreeing with a settled verdict records nothing
    disagree = resolve(
        config, "--token", token(config, "dave", ["approver"]), outcome="succeeded", evidence="r1 at the bank"
    )
    assert disagree.exit_code == 0, disagree.output
    assert "tc-lost stays failed: contradicted by dave, recorded and escalated" in disagree.output
    listed = CliRunner().invoke(app, ["calls", "list", "--unresolved", "-c", str(config)])
    assert "CONTRADICTED" in listed.output and "tc-lost" in listed.output


def test_a_resolution_with_a_token_is_checked_as_the_api_checks_it(tmp_path: Path) -> None:
    config = escalated_store(tmp_path)
    with Store.open(f"sqlite:///{tmp_path / 'writ.db'}") as store:
        store.revoke_principal(RevokePrincipal("acme", "dan", revoked_by="root", now=NOW))

    agent = resolve(config, "--token", token(config, "eve", ["agent"]))
    assert agent.exit_code == 1 and "insufficient_role" in agent.output
    other = resolve(config, env={"WRIT_TOKEN": token(config, "carol", ["approver"], tenant="globex")})
    assert other.exit_code == 1 and "not_found" in other.output
    revoked = resolve(config, "--token", token(config, "dan", ["approver"]))
    assert revoked.exit_code == 1 and "principal_revoked" in revoked.output
    forged = resolve(config, "--token", token(config, "carol", ["approver"])[:-4] + "AAAA")
    assert forged.exit_code == 1 and "did not verify" in forged.output
    assert last_event(tmp_path).type == "reconciliation.escalated"


def test_a_resolution_in_anothers_name_or_without_authority_is_refused(tmp_path: Path) -> None:
    config = escalated_store(tmp_path)

    named = resolve(config, "--by", "carol")
    assert named.exit_code == 2 and "--by is gone" in named.output and "--break-glass" in named.output
    bare = resolve(config)
    assert bare.exit_code == 2 and "no token was given" in bare.output
    unexplained = resolve(config, "--break-glass")
    assert unexplained.exit_code == 2 and "needs --reason" in unexplained.output
    assert last_event(tmp_path).type == "reconciliation.escalated"


def test_a_break_glass_resolution_is_recorded_as_the_operator_with_its_mark(tmp_path: Path) -> None:
    config = escalated_store(tmp_path)

    out = resolve(config, "--break-glass", "--reason", "gateway down, bank confirmed by phone")

    assert out.exit_code == 0, out.output
    operator = f"operator:{getpass.getuser()}@{socket.gethostname()}"
    assert f"resolved by {operator} (break-glass)" in out.output
    payload = last_event(tmp_path).payload
    assert (payload["resolved_by"], payload["break_glass"]) == (operator, True)
    assert payload["reason"] == "gateway down, bank confirmed by phone"
