"""`writ store archive`: the log's checkpointed, settled beginning goes to files; `writ audit verify
--archive` and `writ store rebuild --archive` read them first; a missing file fails verify."""

from __future__ import annotations

from pathlib import Path

from store import Store
from tests.gateway.cli.test_cli_audit import add_calls, config_for, writ


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
