"""The source type-checks: mypy --strict, configured in pyproject.toml, passes over every package.

A cold mypy takes 30 s of CPU, a warm cache a second (scripts/test keeps the cache outside the
checkout, so a fresh clone finds it warm). When the test is selected, tests/conftest.py starts mypy as
the session begins, beside the tests (most of them wait on other processes), and the test collects its
verdict. (Not niced: at load 10, a niced mypy starved.)
"""

from __future__ import annotations

import functools
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def mypy() -> tuple[subprocess.Popen[bytes], Path]:
    """The mypy run over the packages, started once: the process and the file it reports to."""
    # [tool.mypy] names the packages and the strictness; they, and .mypy_cache, are found from the root.
    report = Path(tempfile.mkstemp(prefix="writ-mypy-", suffix=".txt")[1])
    with report.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml")],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return process, report


def stop_mypy() -> None:
    """End the early mypy if the session ends before the test collected it (-x, a deselection)."""
    if mypy.cache_info().currsize:
        process, report = mypy()
        if process.poll() is None:
            process.kill()
            process.wait()
        report.unlink(missing_ok=True)


@pytest.mark.timeout(900)  # a cold mypy --strict over every package, on 2 shared cores
def test_the_packages_pass_the_type_checker() -> None:
    process, report = mypy()
    status = process.wait()
    assert status == 0, f"mypy found type errors:\n{report.read_text()}"
