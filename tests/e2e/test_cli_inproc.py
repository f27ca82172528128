"""`Gateway.cli` runs `writ` by its own `main` in the test process (`harness.writ_inproc`): it answers as
the `writ` process does, and leaves the test process as it found it."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import pytest
import yaml

from gateway.auth.dev_issuer import DevIssuer
from tests.e2e.harness import writ, writ_inproc

pytestmark = pytest.mark.e2e


def test_writ_run_in_this_process_answers_as_the_writ_process_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A token of whoever runs the tests decides for neither; the config is found in the working directory
    # the run was given; its dev issuer beside a real one is a warning logged on stderr.
    monkeypatch.setenv("WRIT_TOKEN", "x.y.z")
    idp = {"issuer": "https://idp.example", "jwks_uri": "https://idp.example/jwks", "discovery": False}
    dev_issuer = {"enabled": True, "key_file": str(tmp_path / "dev-issuer.jwk")}
    config = {"store": {"url": f"sqlite:///{tmp_path / 'writ.db'}"}, "auth": {"issuers": [idp]}}
    config["auth"]["dev_issuer"] = dev_issuer
    (tmp_path / "writ.yaml").write_text(yaml.safe_dump(config))
    # The key there already, as after a first run: whichever run made it would say so and the other not.
    DevIssuer.load_or_create(tmp_path / "dev-issuer.jwk", "http://127.0.0.1:8080/")
    handlers, directory = list(logging.getLogger().handlers), Path.cwd()

    ran = {}
    for args in (("nonesuch",), ("approvals", "approve", "a-1"), ("token", "--sub", "ann")):
        here, there = writ_inproc(*args, cwd=tmp_path, check=False), writ(*args, cwd=tmp_path, check=False)
        assert here.returncode == there.returncode, args
        assert unminted(here.stdout) == unminted(there.stdout), args
        assert unstamped(here.stderr) == unstamped(there.stderr), args
        ran[args[0]] = here
    assert "No such command 'nonesuch'" in ran["nonesuch"].stderr
    assert "no token was given" in ran["approvals"].stderr
    minted = ran["token"]
    assert minted.stdout.startswith("eyJ") and "# token for sub=ann" in minted.stderr
    assert "WARNING gateway.app: auth.dev_issuer is enabled beside 1 configured issuer" in minted.stderr

    assert logging.getLogger().handlers == handlers and Path.cwd() == directory
    assert os.environ["WRIT_TOKEN"] == "x.y.z"


def unstamped(stderr: str) -> str:
    """`stderr` without the times its log lines begin with."""
    return re.sub(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ", "", stderr, flags=re.MULTILINE)


def unminted(stdout: str) -> str:
    """`stdout` with each token (two runs mint two) as `<token>`."""
    return re.sub(r"eyJ[\w.-]+", "<token>", stdout)
