"""The checkpoints benchmark keeps working: a tiny run signs, reads back, verifies and archives, and
asserts on the way that every verify is clean and nothing is left to move."""

from __future__ import annotations

import pytest

from bench.checkpoints import row


def test_a_tiny_run_checkpoints_verifies_and_archives_every_partition(
    capsys: pytest.CaptureFixture[str],
) -> None:
    row("sqlite", 3, [1, 2], rounds=1, archive=True)

    printed = capsys.readouterr().out
    assert "3 partitions" in printed and "1 line(s)" in printed
    assert "2 checkpoint(s)" in printed
    assert "archive_all" in printed and "(3 segments)" in printed
