"""The authorization server's section of the config: refused without a login step, refused on a plain
http public URL off loopback, and its issuer spelled as MCP clients compare it."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.app import build_runtime
from gateway.config import WritConfig
from gateway.errors import ConfigurationError
from gateway.oauth import settings_for
from gateway.oauth.routes import duration_text

USERS = {"type": "builtin", "users": [{"subject": "alice", "tenant": "acme", "roles": ["agent"]}]}
REMOTE = {**USERS, "remote": True}


def config(server: dict[str, object], login: dict[str, object] = REMOTE, **section: object) -> WritConfig:
    return WritConfig.model_validate(
        {"server": server, "auth": {"authorization_server": {"enabled": True, "login": login, **section}}}
    )


def test_an_enabled_server_without_a_login_step_is_refused() -> None:
    with pytest.raises(ValidationError, match="set `login`"):
        WritConfig.model_validate({"auth": {"authorization_server": {"enabled": True}}})


def test_a_plain_http_public_url_off_loopback_is_refused_naming_it() -> None:
    with pytest.raises(ConfigurationError, match="http://writ.example"):
        settings_for(config({"public_url": "http://writ.example"}))


def test_the_built_in_login_is_refused_off_loopback_unless_asked_for() -> None:
    # It asks no password: on a public URL anyone who reached it could sign in as the admin it lists.
    for url in ("https://writ.example.com", "https://10.0.0.5:8443"):
        with pytest.raises(ConfigurationError, match="asks no password"):
            settings_for(config({"public_url": url}, login=USERS))
        assert settings_for(config({"public_url": url}, login=REMOTE)).issuer.startswith("https://")
    for url in ("http://127.0.0.1:8080", "http://localhost:8080", "https://localhost", "http://[::1]:9"):
        assert settings_for(config({"public_url": url}, login=USERS)).base_url == url


def test_the_issuer_is_the_public_url_with_the_slash_clients_compare_and_tokens_are_for_mcp() -> None:
    settings = settings_for(config({"public_url": "https://writ.example.com"}))
    assert settings.issuer == "https://writ.example.com/"
    assert settings.resource == "https://writ.example.com/mcp"
    assert settings_for(config({"host": "127.0.0.1", "port": 8080})).issuer == "http://127.0.0.1:8080/"


def test_scopes_offered_default_to_the_required_ones() -> None:
    base = config({"public_url": "https://writ.example.com"})
    required = base.model_copy(
        update={"auth": base.auth.model_copy(update={"required_scopes": ["writ:tools"]})}
    )
    assert settings_for(required).scopes == ("writ:tools",)
    assert settings_for(config({"public_url": "https://w.example"}, scopes=["a", "b"])).scopes == ("a", "b")


def test_an_issuer_configured_with_the_authorization_servers_own_name_is_refused_before_the_store_opens(
    tmp_path: Path,
) -> None:
    cfg = WritConfig.model_validate(
        {
            "store": {"url": f"sqlite:///{tmp_path / 'writ.db'}"},
            "privacy": {"salt_file": str(tmp_path / "salt")},
            "auth": {
                "issuers": [{"issuer": "http://127.0.0.1:8080/", "jwks_uri": "http://127.0.0.1:9/jwks"}],
                "authorization_server": {
                    "enabled": True,
                    "key_file": str(tmp_path / "k.json"),
                    "login": USERS,
                },
            },
        }
    )
    with pytest.raises(ConfigurationError, match="is Writ's own authorization server"):
        build_runtime(cfg)
    assert not (tmp_path / "writ.db").exists()


def test_a_sign_in_lasts_a_day_unless_configured_and_never_less_than_five_minutes() -> None:
    server = {"public_url": "https://writ.example.com"}
    assert settings_for(config(server)).sign_in_max_age_s == 86400
    assert settings_for(config(server, sign_in_max_age_s=3600)).sign_in_max_age_s == 3600
    # Under five minutes, or not a whole number of seconds: refused, naming the setting.
    for bad in (60, 0, -1, "a day", 1.5):
        with pytest.raises(ValidationError, match="sign_in_max_age_s"):
            config(server, sign_in_max_age_s=bad)


def test_the_consent_page_says_a_lifetime_in_the_largest_whole_unit() -> None:
    assert [duration_text(s) for s in (86400, 2 * 86400, 3600, 5400, 300, 90)] == [
        "1 day",
        "2 days",
        "1 hour",
        "90 minutes",
        "5 minutes",
        "2 minutes",
    ]
