"""The source type-checks: mypy --strict, configured in pyproject.toml, passes over every package."""

from __future__ import annotations

from pathlib import Path

import pytest
from mypy import api

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(900)  # a cold mypy --strict over every package, on 2 shared cores
def test_the_packages_pass_the_type_checker(monkeypatch: pytest.MonkeyPatch) -> None:
    # [tool.mypy] names the packages and the strictness; they, and .mypy_cache, are found from the root.
    monkeypatch.chdir(ROOT)
    report, errors, status = api.run(["--config-file", str(ROOT / "pyproject.toml")])
    assert status == 0, f"mypy found type errors:\n{report}{errors}"
