"""`writ token`: a dev-issuer token the gateway will accept, or a refusal saying why not."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from gateway.cli import app


def dev_config(tmp_path: Path) -> str:
    config = tmp_path / "writ.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "store": {"url": f"sqlite:///{tmp_path / 'writ.db'}"},
                "auth": {"dev_issuer": {"enabled": True, "key_file": str(tmp_path / "k.jwk")}},
            }
        )
    )
    return str(config)


def claims(token: str) -> dict:
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


def test_roles_and_scopes_are_trimmed_so_a_space_after_a_comma_names_no_other_role(tmp_path: Path) -> None:
    # `--roles "agent, approver"` minted the role " approver", which no rule names: no approver.
    args = ["--sub", "bob", "--roles", "agent, approver", "--scopes", "a , b", "-c", dev_config(tmp_path)]
    out = CliRunner().invoke(app, ["token", *args])
    assert out.exit_code == 0, out.output
    minted = claims(out.stdout.strip().splitlines()[-1])
    assert minted["roles"] == ["agent", "approver"] and minted["scope"] == "a b"


def test_a_token_no_gateway_would_accept_is_refused_instead_of_minted(tmp_path: Path) -> None:
    config = dev_config(tmp_path)
    for args in (
        ["--sub", ""],
        ["--sub", "  "],
        ["--sub", "bob", "--ttl", "0"],
        ["--sub", "bob", "--ttl", "-5"],
    ):
        out = CliRunner().invoke(app, ["token", *args, "-c", config])
        assert out.exit_code == 2, (args, out.output)
        assert "eyJ" not in out.stdout
