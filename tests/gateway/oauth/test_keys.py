"""The authorization server's signing keys: made once, shared through the file, rotated without
breaking the tokens the old key signed, and dropped once those have expired."""

from __future__ import annotations

import json
import stat
import time
from pathlib import Path

import pytest

from gateway.auth.issuers import StaticKeys, TrustedIssuer
from gateway.auth.tokens import JwtVerifier
from gateway.errors import ConfigurationError
from gateway.oauth.keys import SigningKeys, rotate

pytestmark = pytest.mark.anyio

ISSUER = "http://127.0.0.1:8080/"
AUDIENCE = "http://127.0.0.1:8080/mcp"


def token(keys: SigningKeys) -> str:
    now = int(time.time())
    return keys.sign({"iss": ISSUER, "sub": "alice", "aud": AUDIENCE, "iat": now, "exp": now + 300})


def verifier(keys: SigningKeys) -> JwtVerifier:
    return JwtVerifier(
        [TrustedIssuer(ISSUER, StaticKeys(keys.public_keys))], audience=AUDIENCE, algorithms=["ES256"]
    )


def test_the_key_file_is_made_private_once_and_every_process_reads_the_same_key(tmp_path: Path) -> None:
    path = tmp_path / "state" / "oauth-keys.json"
    first = SigningKeys.load_or_create(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert SigningKeys.load_or_create(path).kid == first.kid
    published = first.jwks()["keys"]
    assert [k["kid"] for k in published] == [first.kid] and all("d" not in k for k in published)


async def test_after_a_rotation_new_tokens_name_the_new_key_and_old_tokens_still_verify(
    tmp_path: Path,
) -> None:
    path = tmp_path / "oauth-keys.json"
    old = SigningKeys.load_or_create(path)
    before = token(old)
    new = rotate(path, keep_s=900)
    assert new.kid != old.kid
    assert [k["kid"] for k in new.jwks()["keys"]] == [new.kid, old.kid]
    after = token(new)
    assert (await verifier(new).check(before)).subject == "alice"
    assert (await verifier(new).check(after)).subject == "alice"
    assert await verifier(old).verify_token(after) is None  # a replica not yet given the new file


def test_a_key_superseded_longer_ago_than_its_tokens_live_is_dropped_at_the_next_rotation(
    tmp_path: Path,
) -> None:
    path = tmp_path / "oauth-keys.json"
    first = SigningKeys.load_or_create(path)
    second = rotate(path, keep_s=900, now=time.time())
    third = rotate(path, keep_s=900, now=time.time() + 1000)
    assert [k["kid"] for k in third.jwks()["keys"]] == [third.kid, second.kid]
    assert first.kid not in json.dumps(third.jwks())


def test_a_key_file_that_holds_no_signing_key_is_refused_with_its_name(tmp_path: Path) -> None:
    path = tmp_path / "oauth-keys.json"
    path.write_text('{"keys": []}')
    with pytest.raises(ConfigurationError, match="oauth-keys.json"):
        SigningKeys.load_or_create(path)
    path.write_text("not json")
    with pytest.raises(ConfigurationError, match="not a signing key file"):
        SigningKeys.load_or_create(path)
