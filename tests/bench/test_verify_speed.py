"""The verify timing's generated log is one the store could have written: it verifies clean, so the
figure in the README measures a verify that walked, replayed and checked everything."""

from __future__ import annotations

from pathlib import Path

from bench.verify_speed import measure


def test_the_generated_log_verifies_clean_with_every_lifecycle(tmp_path: Path) -> None:
    timing = measure(f"sqlite:///{tmp_path / 'writ.db'}", 120)

    assert timing.ok
    assert timing.events >= 120
