"""Bearer JWT verification: each kind of bad token is refused; a good one becomes a Principal."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import pytest
from joserfc import jwt
from joserfc.jwk import ECKey, OctKey

from gateway.auth.dev_issuer import DevIssuer
from gateway.auth.issuers import StaticKeys, TrustedIssuer
from gateway.auth.tokens import JwtVerifier, principal_from_claims
from gateway.config import ClaimMapping
from gateway.errors import AuthenticationError

pytestmark = pytest.mark.anyio

AUD = "http://127.0.0.1:8080/mcp"
ISS = "http://127.0.0.1:8080/dev-issuer"


@pytest.fixture
def issuer(tmp_path: Path) -> DevIssuer:
    return DevIssuer.load_or_create(tmp_path / "k.jwk", ISS)


@pytest.fixture
def verifier(issuer: DevIssuer) -> JwtVerifier:
    return JwtVerifier(
        [TrustedIssuer(ISS, StaticKeys(issuer.public_keys))], audience=AUD, algorithms=["ES256", "HS256"]
    )


def b64(data: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


async def test_a_token_from_the_dev_issuer_verifies_and_maps_to_a_principal(
    issuer: DevIssuer, verifier: JwtVerifier
) -> None:
    token = issuer.mint(
        subject="alice", audience=AUD, tenant="acme", roles=["agent", "approver"], scopes=["tools"]
    )
    verified = await verifier.verify_token(token)
    assert verified is not None and verified.subject == "alice"
    principal = principal_from_claims(verified.claims, ClaimMapping())
    assert principal.subject == "alice" and principal.tenant == "acme"
    assert principal.roles == {"agent", "approver"} and principal.scopes == {"tools"}


async def test_the_dev_issuer_key_survives_a_restart(tmp_path: Path) -> None:
    first = DevIssuer.load_or_create(tmp_path / "k.jwk", ISS)
    token = first.mint(subject="a", audience=AUD)
    again = DevIssuer.load_or_create(tmp_path / "k.jwk", ISS)
    assert (
        await JwtVerifier(
            [TrustedIssuer(ISS, StaticKeys(again.public_keys))], audience=AUD, algorithms=["ES256"]
        ).verify_token(token)
        is not None
    )
    assert (tmp_path / "k.jwk").stat().st_mode & 0o777 == 0o600


async def test_garbage_is_refused(verifier: JwtVerifier) -> None:
    assert await verifier.verify_token("not a token") is None
    assert await verifier.verify_token("") is None


async def test_alg_none_is_refused(verifier: JwtVerifier) -> None:
    claims = {"iss": ISS, "aud": AUD, "sub": "alice", "exp": int(time.time()) + 60}
    assert await verifier.verify_token(f"{b64({'alg': 'none'})}.{b64(claims)}.") is None


async def test_hs256_signed_with_the_public_key_is_refused_even_when_hs256_is_configured(
    issuer: DevIssuer, verifier: JwtVerifier
) -> None:
    public = json.dumps(issuer.jwks()["keys"][0]).encode()
    claims = {"iss": ISS, "aud": AUD, "sub": "alice", "exp": int(time.time()) + 60}
    forged = jwt.encode({"alg": "HS256"}, claims, OctKey.import_key(public))
    assert await verifier.verify_token(forged) is None


async def test_a_token_signed_by_a_foreign_key_is_refused(verifier: JwtVerifier) -> None:
    foreign = ECKey.generate_key("P-256", auto_kid=True)
    claims = {"iss": ISS, "aud": AUD, "sub": "alice", "exp": int(time.time()) + 60}
    assert (
        await verifier.verify_token(jwt.encode({"alg": "ES256", "kid": foreign.kid}, claims, foreign)) is None
    )


async def test_a_tampered_payload_is_refused(issuer: DevIssuer, verifier: JwtVerifier) -> None:
    header, payload, signature = issuer.mint(subject="alice", audience=AUD, roles=["agent"]).split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims["roles"] = ["admin"]
    assert await verifier.verify_token(f"{header}.{b64(claims)}.{signature}") is None


async def test_expired_and_not_yet_valid_tokens_are_refused(issuer: DevIssuer, verifier: JwtVerifier) -> None:
    assert (
        await verifier.verify_token(issuer.mint(subject="a", audience=AUD, ttl_s=60, now=time.time() - 3600))
        is None
    )
    assert (
        await verifier.verify_token(
            issuer.mint(subject="a", audience=AUD, ttl_s=7200, now=time.time() + 3600)
        )
        is None
    )


async def test_a_token_within_the_leeway_is_accepted(issuer: DevIssuer, verifier: JwtVerifier) -> None:
    assert (
        await verifier.verify_token(issuer.mint(subject="a", audience=AUD, ttl_s=60, now=time.time() - 70))
        is not None
    )


async def test_wrong_issuer_and_wrong_audience_are_refused(tmp_path: Path, verifier: JwtVerifier) -> None:
    other = DevIssuer.load_or_create(tmp_path / "other.jwk", "https://evil.example")
    assert await verifier.verify_token(other.mint(subject="a", audience=AUD)) is None
    same_key_other_aud = DevIssuer.load_or_create(tmp_path / "k.jwk", ISS)
    assert (
        await verifier.verify_token(
            same_key_other_aud.mint(subject="a", audience="https://other.example/mcp")
        )
        is None
    )


def test_claim_mapping_follows_configured_claim_names() -> None:
    mapping = ClaimMapping(tenant="org", roles="groups_roles", default_tenant="none")
    principal = principal_from_claims(
        {"sub": "bob", "org": "o1", "groups_roles": "a b", "azp": "cli"}, mapping
    )
    assert principal.tenant == "o1" and principal.roles == {"a", "b"} and principal.client_id == "cli"
    assert principal_from_claims({"sub": "x"}, mapping).tenant == "none"


@pytest.mark.parametrize(
    "claims",
    [
        {"roles": 5},
        {"roles": {"agent": True}},
        {"roles": [["agent"]]},
        {"groups": [1, 2]},
        {"scope": 5},
        {"scope": ["tools", {"x": 1}]},
        {"tenant": ["acme", "globex"]},
        {"tenant": 7},
        {"client_id": {"a": 1}},
    ],
    ids=repr,
)
async def test_a_signed_token_whose_claims_have_the_wrong_shape_is_refused(
    issuer: DevIssuer, verifier: JwtVerifier, claims: dict[str, object]
) -> None:
    # The issuer's signature is good: only the shapes are wrong. Such a token used to become a 500
    # (scope) or a -32603 on every request (roles), or a tenant named "['acme', 'globex']".
    now = int(time.time())
    payload = {"iss": ISS, "aud": AUD, "sub": "alice", "exp": now + 60, "roles": ["agent"], **claims}
    token = jwt.encode({"alg": "ES256", "kid": issuer.public_keys.keys[0].kid}, payload, issuer._key)
    assert await verifier.verify_token(token) is None


def test_a_principal_is_built_only_from_claims_of_the_right_shape() -> None:
    mapping = ClaimMapping(subject="email")
    with pytest.raises(AuthenticationError, match="'email'"):
        principal_from_claims({"sub": "bob"}, mapping)
    with pytest.raises(AuthenticationError, match="'roles'"):
        principal_from_claims({"email": "bob@x", "roles": 5}, mapping)
    principal = principal_from_claims({"email": "bob@x", "roles": ["a"], "tenant": ""}, mapping)
    assert (principal.subject, principal.tenant, principal.roles) == ("bob@x", "default", {"a"})


class _CountingDecode:
    def __init__(self) -> None:
        self.calls = 0
        self._decode = jwt.decode

    def __call__(self, *args: object, **kwargs: object) -> object:
        self.calls += 1
        return self._decode(*args, **kwargs)


async def test_a_verified_token_is_remembered_so_its_signature_is_checked_once(
    issuer: DevIssuer, verifier: JwtVerifier, monkeypatch: pytest.MonkeyPatch
) -> None:
    counting = _CountingDecode()
    monkeypatch.setattr("gateway.auth.tokens.jwt.decode", counting)
    token = issuer.mint(subject="alice", audience=AUD)
    assert await verifier.verify_token(token) is not None
    assert await verifier.verify_token(token) is not None
    assert counting.calls == 1


async def test_a_remembered_token_is_never_served_past_its_expiry(
    issuer: DevIssuer, verifier: JwtVerifier, monkeypatch: pytest.MonkeyPatch
) -> None:
    counting = _CountingDecode()
    monkeypatch.setattr("gateway.auth.tokens.jwt.decode", counting)
    within_leeway = issuer.mint(subject="alice", audience=AUD, ttl_s=60, now=time.time() - 70)
    assert await verifier.verify_token(within_leeway) is not None
    assert await verifier.verify_token(within_leeway) is not None
    assert counting.calls == 2
