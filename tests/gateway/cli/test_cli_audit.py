"""`writ audit checkpoint` and `writ audit verify`: a log rewritten or cut short behind the store's back
fails verify against the checkpoints, naming the first bad seq; a rotated key still verifies; projections
changed behind the log and forged events resealed into it fail verify by their row and seq."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from click.testing import Result
from typer.testing import CliRunner

from gateway.cli.main import app
from store import Store
from store import events as ev
from store.schema import approvals, effect_ledger
from tests.postgres import fresh_store
from tests.store import tamper
from tests.store.builders import NOW, REQUIRE_APPROVAL, call_request, outcome
from tests.store.histories import record_every_path


@pytest.fixture
def logged(tmp_path: Path) -> Iterator[tuple[Path, Store]]:
    """A config naming a SQLite store of three completed calls (10 events) and where its checkpoints go."""
    url = f"sqlite:///{tmp_path / 'writ.db'}"
    with Store.open(url) as store:
        store.migrate()
        add_calls(store, 3)
        yield config_for(tmp_path, url), store


def config_for(tmp_path: Path, url: str) -> Path:
    checkpoints = {
        "directory": str(tmp_path / "checkpoints"),
        "key_file": str(tmp_path / "keys" / "checkpoint.jwk"),
        "trusted_keys": str(tmp_path / "keys" / "trusted.jwks"),
    }
    config = tmp_path / "writ.yaml"
    config.write_text(yaml.safe_dump({"store": {"url": url}, "audit": {"checkpoints": checkpoints}}))
    return config


def add_calls(store: Store, calls: int, first: int = 1) -> None:
    """`calls` completed calls in one run: 3 events each, and the run.started of the first."""
    for n in range(first, first + calls):
        store.admit(call_request(tool_call_id=f"tc-{n}", idempotency_key=f"k{n}"))
        store.record_outcome(outcome(f"tc-{n}", "completed", result={"ok": True}, now=NOW))


def writ(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


def test_a_rewrite_resealed_to_the_head_fails_verify_at_its_seq(logged: tuple[Path, Store]) -> None:
    config, store = logged
    made = writ("audit", "checkpoint", "-c", str(config))
    assert made.exit_code == 0, made.output
    assert "checkpoint at seq 10" in made.output
    tamper.rewrite_from(store, 5)

    verified = writ("audit", "verify", "-c", str(config))

    assert verified.exit_code == 1, verified.output
    assert "first bad seq 5 (rewritten)" in verified.output


def test_a_log_cut_short_fails_verify_after_its_last_event(logged: tuple[Path, Store]) -> None:
    config, store = logged
    writ("audit", "checkpoint", "-c", str(config))
    tamper.truncate_to(store, 7)

    verified = writ("audit", "verify", "-c", str(config))

    assert verified.exit_code == 1, verified.output
    assert "first bad seq 8 (truncated)" in verified.output


def test_checkpoints_of_a_rotated_key_still_verify_and_later_events_are_counted(
    logged: tuple[Path, Store],
) -> None:
    config, store = logged
    assert writ("audit", "checkpoint", "-c", str(config)).exit_code == 0
    add_calls(store, 1, first=10)
    rotated = writ("audit", "checkpoint", "--new-key", "-c", str(config))
    assert rotated.exit_code == 0, rotated.output
    add_calls(store, 1, first=20)

    verified = writ("audit", "verify", "-c", str(config))

    assert verified.exit_code == 0, verified.output
    assert "ok: 16 events, hash chain intact" in verified.output
    assert "anchored up to seq 13 by 2 checkpoints" in verified.output
    assert "3 later events not yet anchored" in verified.output


def test_a_forged_checkpoint_line_fails_verify_naming_its_file_and_line(
    tmp_path: Path, logged: tuple[Path, Store]
) -> None:
    config, _ = logged
    writ("audit", "checkpoint", "-c", str(config))
    (path,) = (tmp_path / "checkpoints").glob("*.jws")
    head, payload, signature = path.read_text().strip().split(".")
    flipped = signature[:10] + ("B" if signature[10] == "A" else "A") + signature[11:]
    with path.open("a") as fh:
        fh.write(f"{head}.{payload}.{flipped}\n")

    verified = writ("audit", "verify", "-c", str(config))

    assert verified.exit_code == 1
    assert f"{path}:2" in verified.output


def test_checkpoints_given_on_the_command_line_are_checked(
    tmp_path: Path, logged: tuple[Path, Store]
) -> None:
    config, store = logged
    writ("audit", "checkpoint", "-c", str(config))
    moved = tmp_path / "offsite"
    (tmp_path / "checkpoints").rename(moved)
    tamper.rewrite_from(store, 2)
    assert writ("audit", "verify", "-c", str(config)).exit_code == 0  # no checkpoints where configured

    verified = writ("audit", "verify", "-c", str(config), "--checkpoints", str(moved))

    assert verified.exit_code == 1
    assert "first bad seq 2 (rewritten)" in verified.output


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def history(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Path, Store]]:
    """A config naming a store of either kind holding every path a call can take, and `waiting`, a call
    still waiting for its approval."""
    with fresh_store(request, tmp_path) as (url, store):
        record_every_path(store)
        waiting = call_request(tool_call_id="waiting", idempotency_key="k-waiting", decision=REQUIRE_APPROVAL)
        store.admit(waiting)
        yield config_for(tmp_path, url), store


def test_verify_replays_a_clean_log_of_every_path_and_says_so(history: tuple[Path, Store]) -> None:
    config, _ = history

    verified = writ("audit", "verify", "-c", str(config))

    assert verified.exit_code == 0, verified.output
    assert verified.output.startswith("ok: ")
    assert "projections: match" in verified.output
    assert "grammar: ok" in verified.output


def test_an_approval_forged_in_the_database_fails_verify_naming_table_key_and_column(
    history: tuple[Path, Store],
) -> None:
    config, store = history
    call = store.get_call("waiting")
    assert call is not None and call.approval_id is not None
    tamper.set_projection(store, approvals, {"approval_id": call.approval_id}, status="approved")

    verified = writ("audit", "verify", "-c", str(config))

    assert verified.exit_code == 1, verified.output
    assert "hash chain intact" in verified.output  # the chain cannot see it
    assert (
        f"projections: first difference in approvals [approval_id={call.approval_id}] column status: "
        "stored 'approved', replayed 'awaiting_approval'"
    ) in verified.output
    assert "grammar: ok" in verified.output


def test_an_emptied_effect_ledger_fails_verify_naming_its_first_key(history: tuple[Path, Store]) -> None:
    config, store = history
    tamper.delete_projection_rows(store, effect_ledger)

    verified = writ("audit", "verify", "-c", str(config))

    assert verified.exit_code == 1, verified.output
    assert "projections: first difference in effect_ledger [tenant=acme, subject=alice, " in verified.output
    assert "stored absent, replayed a row" in verified.output


def test_a_forged_dispatch_resealed_into_the_log_fails_verify_at_its_seq(history: tuple[Path, Store]) -> None:
    config, store = history
    call = store.get_call("waiting")
    assert call is not None
    seq = store.log_head()[0] + 1
    payload = ev.ToolCallDispatching(
        attempt=1, idempotency_key=call.idempotency_key, external_request_id=call.external_request_id
    )
    forged = ev.ToolCallDispatchingEvent(**tamper.envelope_of_call(store, "waiting"), payload=payload)
    tamper.inject_resealed(store, seq, forged)

    verified = writ("audit", "verify", "-c", str(config))

    assert verified.exit_code == 1, verified.output
    assert "projections: match" in verified.output
    violation = f"grammar: first violation at seq {seq} (call waiting): dispatch_without_approval"
    assert violation in verified.output


def test_a_log_whose_chain_is_broken_is_not_replayed(logged: tuple[Path, Store]) -> None:
    config, store = logged
    tamper.edit_payload(store, 4)

    verified = writ("audit", "verify", "-c", str(config))

    assert verified.exit_code == 1
    assert "first bad seq 4 (edited)" in verified.output
    assert "projections: not compared" in verified.output


def test_verify_without_room_for_its_scratch_file_exits_2_and_finds_nothing(
    logged: tuple[Path, Store], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, _ = logged
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-directory"))

    verified = writ("audit", "verify", "-c", str(config))

    assert verified.exit_code == 2
    assert "cannot verify: verify's scratch database" in verified.output
    assert "TAMPERED" not in verified.output
