"""`writ audit checkpoint` and `writ audit verify`: a log rewritten or cut short behind the store's back
fails verify against the checkpoints, naming the first bad seq; a rotated key still verifies."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from click.testing import Result
from typer.testing import CliRunner

from gateway.cli.main import app
from store import Store
from tests.store import tamper
from tests.store.builders import NOW, call_request, outcome


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
