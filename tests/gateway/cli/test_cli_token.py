"""`writ token`: a dev-issuer token the gateway will accept, or a refusal saying why not."""

from __future__ import annotations

import base64
import json
import logging
from pathlib import Path

import anyio
import pytest
import yaml
from typer.testing import CliRunner

from gateway.app import build_runtime
from gateway.auth.dev_issuer import DevIssuer
from gateway.cli.main import app
from gateway.config import load_config


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


def _issuer_config(tmp_path: Path, auth: dict[str, object]) -> str:
    config = tmp_path / "writ.yaml"
    idp = {"issuer": "https://idp.example", "jwks_uri": "https://idp.example/jwks", "discovery": False}
    config.write_text(
        yaml.safe_dump(
            {"store": {"url": f"sqlite:///{tmp_path / 'writ.db'}"}, "auth": {"issuers": [idp], **auth}}
        )
    )
    return str(config)


def test_a_config_with_real_issuers_and_no_dev_issuer_section_mints_nothing_and_says_how(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The default key path is relative: a key left in the working directory once trusted every token.
    monkeypatch.chdir(tmp_path)
    out = CliRunner().invoke(
        app, ["token", "--sub", "mallory", "--roles", "admin", "-c", _issuer_config(tmp_path, {})]
    )
    assert out.exit_code != 0 and "eyJ" not in out.stdout
    assert "development issuer is off" in out.output and "dev_issuer: {enabled: true}" in out.output
    assert not (tmp_path / ".writ" / "dev-issuer.jwk").exists()


def test_a_gateway_with_real_issuers_trusts_no_key_it_generated_unless_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    planted = DevIssuer.load_or_create(
        tmp_path / ".writ" / "dev-issuer.jwk", "http://127.0.0.1:8080/dev-issuer"
    )
    runtime = build_runtime(load_config(_issuer_config(tmp_path, {})))
    try:
        assert runtime.dev_issuer is None
        token = planted.mint(subject="mallory", audience=runtime.config.server.resource_url, roles=["admin"])
        assert anyio.run(runtime.verifier.verify_token, token) is None
    finally:
        runtime.store.close()


def test_the_dev_issuer_beside_real_issuers_is_a_warning_at_startup(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    key = str(tmp_path / "k.jwk")
    with caplog.at_level(logging.WARNING, logger="gateway.app"):
        runtime = build_runtime(
            load_config(_issuer_config(tmp_path, {"dev_issuer": {"enabled": True, "key_file": key}}))
        )
    runtime.store.close()
    assert runtime.dev_issuer is not None
    assert any("dev_issuer is enabled beside 1 configured issuer" in r.getMessage() for r in caplog.records)
