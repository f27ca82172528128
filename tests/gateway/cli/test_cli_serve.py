"""`writ serve` says which configuration it serves before it serves it."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from typer.testing import CliRunner

import gateway.serve
from gateway.cli.main import app
from gateway.config import WritConfig


def _served(monkeypatch: pytest.MonkeyPatch, *args: str) -> list[WritConfig]:
    """The configs `writ serve ARGS` would serve (nothing is served)."""
    served: list[WritConfig] = []
    monkeypatch.setattr(gateway.serve, "serve_http", served.append)
    result = CliRunner().invoke(app, ["serve", *args])
    assert result.exit_code == 0, result.output
    return served


def test_serve_without_a_config_file_says_so_naming_where_it_looked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("WRIT_CONFIG", raising=False)
    with caplog.at_level(logging.WARNING, logger="gateway.cli.main"):
        [config] = _served(monkeypatch)
    assert config.source is None and not config.capabilities
    [said] = [r.getMessage() for r in caplog.records if r.name == "gateway.cli.main"]
    assert said.startswith("no config file found") and "no capabilities" in said
    assert "$WRIT_CONFIG" in said and str(tmp_path / "writ.yaml") in said
    assert str(tmp_path / ".writ" / "demo.yaml") in said


def test_serve_with_a_config_file_in_the_directory_says_nothing_of_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("WRIT_CONFIG", raising=False)
    (tmp_path / "writ.yaml").write_text("server: {port: 18799}\n")
    with caplog.at_level(logging.WARNING, logger="gateway.cli.main"):
        [config] = _served(monkeypatch)
    assert config.server.port == 18799 and config.source == "writ.yaml"
    assert not [r for r in caplog.records if r.name == "gateway.cli.main"]
