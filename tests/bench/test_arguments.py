"""The benchmark's commands refuse what they cannot run before they start anything (their runs start
gateways: `tests/test_bench.py` runs `bench/run.py`; `bench/interleaved.py`'s are for the benchmark)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from bench import interleaved, run

Main = Callable[[list[str]], None]


@pytest.mark.parametrize(
    ("main", "argv", "says"),
    [
        (interleaved.main, ["--before", "/tmp"], "--before and --after go together"),
        (interleaved.main, ["--stores", "mysql"], "--stores takes sqlite, postgres or both"),
        (interleaved.main, ["--stores", ","], "--stores takes sqlite, postgres or both"),
        (interleaved.main, ["--op", "delete"], "argument --op: invalid choice: 'delete'"),
        (interleaved.main, ["--clients", "0"], "--clients takes 1 (CPU against the bare proxy) or more"),
        (
            interleaved.main,
            ["--clients", "8", "--block", "5"],
            "--block 5 cannot give each of --clients 8 a call",
        ),
        (run.main, ["--interleave", "-1"], "--interleave takes 0 or more rounds"),
        (run.main, ["--interleave-block", "0"], "--interleave-block 1 or more calls"),
        (run.main, ["--interleave-clients", "-1"], "--interleave-clients 0 or more"),
        (
            run.main,
            ["--interleave-block", "5"],
            "--interleave-block 5 cannot give each of --interleave-clients 8",
        ),
        (run.main, ["--policy-checks", "maybe"], "--policy-checks: 'maybe': use off, on or off,on"),
    ],
)
def test_arguments_a_command_cannot_run_are_refused_before_anything_starts(
    main: Main, argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert says in capsys.readouterr().err
