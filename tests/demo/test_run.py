"""`writ demo`'s own config file: written afresh at each start, an operator's edits kept aside."""

from __future__ import annotations

from pathlib import Path

import pytest

from demo.run import write_demo_config


def test_an_edited_demo_config_is_kept_aside_and_the_demo_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    config = write_demo_config(8080, 8081)
    fresh = config.read_text()
    assert "8081" in fresh and capsys.readouterr().err == ""

    config.write_text(fresh + "# my change\n")  # a new user edits the demo's config, as the README invites
    assert write_demo_config(8080, 8081).read_text() == fresh

    kept = tmp_path / ".writ" / "demo.yaml.bak"
    assert kept.read_text() == fresh + "# my change\n"
    said = capsys.readouterr().err
    assert "was edited; kept as .writ/demo.yaml.bak" in said and "writ serve" in said
    # Unedited, on other ports: written afresh, nothing kept, nothing said.
    assert "9091" in write_demo_config(9090, 9091).read_text()
    assert kept.read_text() == fresh + "# my change\n" and capsys.readouterr().err == ""
