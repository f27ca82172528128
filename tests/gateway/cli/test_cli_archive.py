"""`writ store archive`: the log's checkpointed, settled beginning goes to files (each partition's of a
partitioned log); `writ audit verify --archive` and `writ store rebuild --archive` read them first; a
missing file fails verify, and an archived event edited is named by its partition and seq."""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from store import Store
from store.partitions import Partitioning
from tests.gateway.cli.test_cli_audit import add_calls, config_for, writ
from tests.postgres import fresh_store
from tests.store.builders import NOW, call_request, outcome


def test_archive_then_verify_and_rebuild_read_the_archive_and_a_missing_file_fails_verify(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'writ.db'}"
    archive = tmp_path / "archive"
    with Store.open(url) as store:
        store.migrate()
        add_calls(store, 3)  # 10 events, dated 2026-11-30
        config = str(config_for(tmp_path, url))
        refused = writ("store", "archive", "--to", str(archive), "-c", config)
        assert refused.exit_code == 2 and "no signed checkpoint" in refused.output
        assert writ("audit", "checkpoint", "-c", config).exit_code == 0
        add_calls(store, 1, first=4)  # seqs 11-13: after the checkpoint, they stay

        moved = writ("store", "archive", "--to", str(archive), "--older-than-days", "1", "-c", config)

        assert moved.exit_code == 0, moved.output
        assert "archived seqs 1-10" in moved.output
        assert f"from now on: `writ audit verify --archive {archive}`" in moved.output
        verified = writ("audit", "verify", "--archive", str(archive), "-c", config)
        assert verified.exit_code == 0, verified.output
        assert "ok: 13 events, hash chain intact" in verified.output
        assert "anchored up to seq 10" in verified.output
        alone = writ("audit", "verify", "-c", config)
        assert alone.exit_code == 1 and "first bad seq 1 (deleted)" in alone.output
        assert writ("store", "rebuild", "-c", config).exit_code == 2
        rebuilt = writ("store", "rebuild", "--archive", str(archive), "-c", config)
        assert rebuilt.exit_code == 0 and "from 13 events" in rebuilt.output

        next(archive.glob("*.jsonl.gz")).unlink()
        missing = writ("audit", "verify", "--archive", str(archive), "-c", config)
        assert missing.exit_code == 1
        assert "first bad seq 1 (deleted)" in missing.output and "cannot be read" in missing.output


def test_a_checkpoint_after_the_logs_first_event_was_archived_names_the_log_as_before(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'writ.db'}"
    archive = tmp_path / "archive"
    with Store.open(url) as store:
        store.migrate()
        add_calls(store, 3)
        config = str(config_for(tmp_path, url))
        assert writ("audit", "checkpoint", "-c", config).exit_code == 0
        moved = writ("store", "archive", "--to", str(archive), "--older-than-days", "1", "-c", config)
        assert "archived seqs 1-10" in moved.output
        add_calls(store, 1, first=4)  # seqs 11-13

        made = writ("audit", "checkpoint", "-c", config)

        assert made.exit_code == 0, made.output
        assert "checkpoint at seq 13" in made.output
        verified = writ("audit", "verify", "--archive", str(archive), "-c", config)
        assert verified.exit_code == 0, verified.output
        assert "anchored up to seq 13 by 2 checkpoints" in verified.output


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def partitioned(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Store]]:
    """A config naming a fresh store of either kind partitioned by tenant (`store.log.partition_by`)."""
    with fresh_store(request, tmp_path, partitioning=Partitioning("tenant")) as (url, store):
        config = config_for(tmp_path, url)
        settings = yaml.safe_load(config.read_text())
        settings["store"]["log"] = {"partition_by": "tenant"}
        config.write_text(yaml.safe_dump(settings))
        yield str(config), store


def _settle(store: Store, name: str, tenant: str, run_id: str) -> None:
    store.admit(call_request(tool_call_id=name, idempotency_key=name, tenant=tenant, run_id=run_id))
    store.record_outcome(outcome(name, "completed", result={"ok": True}, now=NOW))


def test_a_partitioned_log_is_checkpointed_archived_verified_and_rebuilt_and_an_edit_is_named(
    partitioned: tuple[str, Store], tmp_path: Path
) -> None:
    config, store = partitioned
    archive = tmp_path / "archive"
    for name in ("a1", "a2"):
        _settle(store, name, "acme", "run-a")  # t:acme 1-7
    _settle(store, "g1", "globex", "run-g")  # t:globex 1-4; partition "" has no event

    made = writ("audit", "checkpoint", "-c", config)

    assert made.exit_code == 0, made.output
    assert "checkpoint at seq 0 and the heads of 2 other partitions" in made.output
    _settle(store, "a3", "acme", "run-a")  # t:acme 8-10: after the checkpoint, they stay
    moved = writ("store", "archive", "--to", str(archive), "--older-than-days", "1", "-c", config)
    assert moved.exit_code == 0, moved.output
    assert "archived partition 't:acme' seqs 1-7" in moved.output
    assert "archived partition 't:globex' seqs 1-4" in moved.output
    verified = writ("audit", "verify", "--archive", str(archive), "-c", config)
    assert verified.exit_code == 0, verified.output
    assert "ok: 14 events, hash chain intact" in verified.output
    assert "anchored 11 events across the log's partitions" in verified.output
    assert "3 later events not yet anchored" in verified.output
    alone = writ("audit", "verify", "-c", config)
    assert alone.exit_code == 1 and "first bad seq 1 (deleted): partition 't:acme'" in alone.output
    assert writ("store", "rebuild", "-c", config).exit_code == 2
    rebuilt = writ("store", "rebuild", "--archive", str(archive), "-c", config)
    assert rebuilt.exit_code == 0 and "from 14 events" in rebuilt.output

    segment = next(s for s in _manifest(archive) if s["partition"] == "t:globex")
    path = archive / segment["file"]
    rows = [json.loads(line) for line in gzip.decompress(path.read_bytes()).decode().splitlines()]
    rows[2]["payload"] = json.dumps({**json.loads(rows[2]["payload"]), "forged": 1})
    path.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    manifest = archive / "manifest.jsonl"
    manifest.write_text(
        manifest.read_text().replace(segment["sha256"], hashlib.sha256(path.read_bytes()).hexdigest())
    )
    edited = writ("audit", "verify", "--archive", str(archive), "-c", config)
    assert edited.exit_code == 1
    assert "TAMPERED: first bad seq 3 (edited): partition 't:globex'" in edited.output


def _manifest(archive: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (archive / "manifest.jsonl").read_text().splitlines()]
