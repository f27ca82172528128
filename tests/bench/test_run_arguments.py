"""`bench/run.py` refuses what it cannot run before it starts anything (its runs: `tests/test_bench.py`)."""

from __future__ import annotations

import pytest

from bench import run


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--interleave", "-1"], "--interleave takes 0 or more rounds"),
        (["--interleave-block", "0"], "--interleave-block 1 or more calls"),
        (["--interleave-clients", "-1"], "--interleave-clients 0 or more"),
        (
            ["--interleave-block", "5"],
            "--interleave-block 5 cannot give each of --interleave-clients 8 a call",
        ),
        (["--policy-checks", "maybe"], "--policy-checks: 'maybe': use off, on or off,on"),
    ],
)
def test_arguments_it_cannot_run_are_refused_before_anything_starts(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        run.main(argv)
    assert exited.value.code == 2
    assert says in capsys.readouterr().err
