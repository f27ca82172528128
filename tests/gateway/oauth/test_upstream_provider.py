"""The upstream provider's client on its own, against a provider faked with httpx2's MockTransport: how
the code is exchanged, which ID tokens are refused, and how claims of the shapes Entra ID, Keycloak and
Okta send become the user. The provider as a real process, with a browser, is in test_upstream.py."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote_plus, urlsplit

import httpx2
import pytest
import yaml
from joserfc import jwt
from joserfc.jwk import RSAKey

from gateway.app import build_runtime
from gateway.auth.issuers import IssuerUnavailable
from gateway.config import WritConfig
from gateway.errors import ConfigurationError
from gateway.oauth import settings_for
from gateway.oauth.upstream import Attempt, UpstreamProvider, UpstreamRefused, upstream_providers
from store.oauth import Grantee

pytestmark = pytest.mark.anyio

ISSUER = "https://login.example.test/tenant-1/v2.0"
KEY = RSAKey.generate_key(2048, parameters={"kid": "k1"}, private=True)


class FakeProvider:
    def __init__(self) -> None:
        self.claims: dict[str, Any] = {}
        self.token_forms: list[dict[str, str]] = []
        self.token_headers: list[httpx2.Headers] = []
        self.token_status = 200
        self.raw_id_token: str | None = None

    def handler(self, request: httpx2.Request) -> httpx2.Response:
        path = request.url.path
        if path.endswith("/.well-known/openid-configuration"):
            return httpx2.Response(
                200,
                json={
                    "issuer": ISSUER,
                    "authorization_endpoint": f"{ISSUER}/authorize?p=x",
                    "token_endpoint": f"{ISSUER}/token",
                    "jwks_uri": f"{ISSUER}/keys",
                },
            )
        if path.endswith("/keys"):
            return httpx2.Response(200, json={"keys": [KEY.as_dict(private=False)]})
        if path.endswith("/token"):
            self.token_forms.append({k: v[0] for k, v in parse_qs(request.content.decode()).items()})
            self.token_headers.append(request.headers)
            if self.token_status != 200:
                return httpx2.Response(self.token_status, json={"error": "invalid_grant"})
            return httpx2.Response(
                200,
                json={
                    "access_token": "x",
                    "token_type": "Bearer",
                    "id_token": self.raw_id_token or self.sign(),
                },
            )
        return httpx2.Response(404)

    def sign(self) -> str:
        now = int(time.time())
        claims = {"iss": ISSUER, "aud": "writ", "sub": "u-1", "iat": now, "exp": now + 300} | self.claims
        kept = {k: v for k, v in claims.items() if v is not None}  # None: left out
        return jwt.encode({"alg": "RS256", "kid": "k1"}, kept, KEY)


def provider_for(fake: FakeProvider, tmp_path: Path, **spec: Any) -> UpstreamProvider:
    (tmp_path / "secret").write_text("s3cret:/+\n")
    config = WritConfig.model_validate(
        {
            "server": {"public_url": "https://writ.example.com"},
            "auth": {
                "authorization_server": {
                    "enabled": True,
                    "login": {
                        "type": "oidc",
                        "providers": [
                            {
                                "id": "entra",
                                "issuer": ISSUER,
                                "client_id": "writ",
                                "client_secret_file": str(tmp_path / "secret"),
                                **spec,
                            }
                        ],
                    },
                }
            },
        }
    )
    http = lambda: httpx2.AsyncClient(transport=httpx2.MockTransport(fake.handler))  # noqa: E731
    (provider,) = upstream_providers(config, environ={}, base_dir=tmp_path, http=http)
    return provider


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    yield FakeProvider()


async def test_the_authorization_url_keeps_the_endpoints_own_query_and_names_writs_callback(
    fake: FakeProvider, tmp_path: Path
) -> None:
    provider = provider_for(fake, tmp_path)
    attempt = Attempt.start("entra")
    url = await provider.authorization_url(attempt)
    assert url.startswith(f"{ISSUER}/authorize?p=x&")
    query = {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}
    assert query["redirect_uri"] == "https://writ.example.com/authorize/oidc/entra/callback"
    assert query["code_challenge"] == attempt.challenge and query["code_challenge_method"] == "S256"
    assert (query["state"], query["nonce"], query["scope"]) == (
        attempt.state,
        attempt.nonce,
        "openid profile email",
    )


async def test_the_code_is_exchanged_with_the_verifier_and_the_secret_form_encoded_in_basic_auth(
    fake: FakeProvider, tmp_path: Path
) -> None:
    provider = provider_for(fake, tmp_path)
    attempt = Attempt.start("entra")
    fake.claims = {"nonce": attempt.nonce}
    await provider.sign_in("the-code", attempt)
    (form,), (headers,) = fake.token_forms, fake.token_headers
    assert form["code"] == "the-code" and form["code_verifier"] == attempt.verifier
    assert "client_secret" not in form
    user, _, secret = base64.b64decode(headers["authorization"].split()[1]).decode().partition(":")
    assert (unquote_plus(user), unquote_plus(secret)) == ("writ", "s3cret:/+")
    assert secret != "s3cret:/+", "RFC 6749 §2.3.1: the secret is form-encoded first"


async def test_client_secret_post_sends_the_secret_in_the_form(fake: FakeProvider, tmp_path: Path) -> None:
    provider = provider_for(fake, tmp_path, token_endpoint_auth_method="client_secret_post")
    attempt = Attempt.start("entra")
    fake.claims = {"nonce": attempt.nonce}
    await provider.sign_in("c", attempt)
    assert fake.token_forms[0]["client_secret"] == "s3cret:/+"
    assert "authorization" not in fake.token_headers[0]


async def test_entra_shaped_claims_map_tid_to_the_tenant_and_app_roles_to_roles(
    fake: FakeProvider, tmp_path: Path
) -> None:
    provider = provider_for(fake, tmp_path, claims={"subject": "oid", "tenant": "tid"})
    attempt = Attempt.start("entra")
    fake.claims = {"nonce": attempt.nonce, "oid": "0000-oid", "tid": "tenant-1", "roles": ["Writ.Approver"]}
    user = await provider.sign_in("c", attempt)
    assert user == Grantee("0000-oid", "tenant-1", ("Writ.Approver",), ())


async def test_dotted_claim_names_reach_into_nested_claims_and_a_missing_tenant_is_the_default(
    fake: FakeProvider, tmp_path: Path
) -> None:
    claims = {"roles": "realm_access.roles", "default_tenant": "acme"}
    provider = provider_for(fake, tmp_path, claims=claims)
    attempt = Attempt.start("entra")
    fake.claims = {"nonce": attempt.nonce, "realm_access": {"roles": ["b", "a"]}, "groups": "x y"}
    assert await provider.sign_in("c", attempt) == Grantee("u-1", "acme", ("a", "b"), ("x", "y"))


async def test_default_roles_are_added_to_those_the_token_names(fake: FakeProvider, tmp_path: Path) -> None:
    provider = provider_for(fake, tmp_path, claims={"tenant": "hd", "default_roles": ["agent"]})
    attempt = Attempt.start("entra")
    fake.claims = {"nonce": attempt.nonce, "hd": "example.com"}
    assert await provider.sign_in("c", attempt) == Grantee("u-1", "example.com", ("agent",), ())
    fake.claims = {"nonce": attempt.nonce, "roles": ["approver"]}
    assert (await provider.sign_in("c", attempt)).roles == ("agent", "approver")


async def test_a_required_true_claim_takes_only_true(fake: FakeProvider, tmp_path: Path) -> None:
    provider = provider_for(
        fake, tmp_path, claims={"subject": "email"}, required_claims={"email_verified": True}
    )
    attempt = Attempt.start("entra")
    for unverified in ("true", 1, False, None):
        fake.claims = {"nonce": attempt.nonce, "email": "a@example.com", "email_verified": unverified}
        with pytest.raises(UpstreamRefused, match="email_verified claim is not one allowed here"):
            await provider.sign_in("c", attempt)
    fake.claims = {"nonce": attempt.nonce, "email": "a@example.com", "email_verified": True}
    assert (await provider.sign_in("c", attempt)).subject == "a@example.com"


async def test_a_groups_overage_is_refused_rather_than_signing_in_without_the_groups(
    fake: FakeProvider, tmp_path: Path
) -> None:
    provider = provider_for(fake, tmp_path)
    attempt = Attempt.start("entra")
    fake.claims = {"nonce": attempt.nonce, "_claim_names": {"groups": "src1"}, "_claim_sources": {"src1": {}}}
    with pytest.raises(UpstreamRefused, match="too many to list"):
        await provider.sign_in("c", attempt)


@pytest.mark.parametrize(
    ("claims", "reason"),
    [
        ({"aud": ["writ", "other"]}, "azp claim is not accepted"),
        ({"aud": ["writ", "other"], "azp": "other"}, "azp claim is not accepted"),
        ({"exp": int(time.time()) - 3600}, "exp claim is not accepted"),
        ({"sub": None}, "no sub claim"),
        ({"roles": 5}, "claim 'roles' is not a string or a list of strings"),
        ({"org": "globex"}, "org claim is not one allowed here"),
    ],
)
async def test_id_tokens_the_sign_in_cannot_take_are_refused_saying_why(
    fake: FakeProvider, tmp_path: Path, claims: dict[str, Any], reason: str
) -> None:
    provider = provider_for(fake, tmp_path, required_claims={"org": "acme"})
    attempt = Attempt.start("entra")
    fake.claims = {"nonce": attempt.nonce, "org": "acme"} | claims
    with pytest.raises(UpstreamRefused, match=reason):
        await provider.sign_in("c", attempt)


def _token(alg: str, signature: Callable[[bytes], bytes] = lambda _: b"") -> str:
    """A token with our claims, `alg` in its header and the signature `signature` makes of its input."""
    now = int(time.time())
    header = {"alg": alg, "kid": "k1"}
    claims = {"iss": ISSUER, "aud": "writ", "sub": "u-1", "iat": now, "exp": now + 300}
    signing_input = ".".join(_b64(json.dumps(part).encode()) for part in (header, claims))
    return f"{signing_input}.{_b64(signature(signing_input.encode()))}"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _hmac_with_the_public_key(signing_input: bytes) -> bytes:
    # The algorithm confusion attack: HS256 keyed with the provider's public key, which anyone has.
    return hmac.new(KEY.as_pem(private=False), signing_input, hashlib.sha256).digest()


@pytest.mark.parametrize(
    "token",
    [
        "not a jwt",
        "a.b.c",
        _token("none"),
        _token("HS256", _hmac_with_the_public_key),
        _token("RS256", lambda _: b"forged"),
    ],
)
async def test_an_id_token_that_is_malformed_unsigned_or_forged_is_refused(
    fake: FakeProvider, tmp_path: Path, token: str
) -> None:
    provider = provider_for(fake, tmp_path)
    fake.raw_id_token = token
    with pytest.raises(UpstreamRefused, match="the ID token"):
        await provider.sign_in("c", Attempt.start("entra"))


async def test_a_provider_refusing_the_code_is_refused_and_one_failing_is_unavailable(
    fake: FakeProvider, tmp_path: Path
) -> None:
    provider = provider_for(fake, tmp_path)
    fake.token_status = 400
    with pytest.raises(UpstreamRefused, match="refused the code: invalid_grant"):
        await provider.sign_in("c", Attempt.start("entra"))
    fake.token_status = 503
    with pytest.raises(IssuerUnavailable, match="HTTP 503"):
        await provider.sign_in("c", Attempt.start("entra"))


# -- the configuration ----------------------------------------------------------------------------


def oidc(**provider: Any) -> dict[str, Any]:
    spec = {"id": "corp", "issuer": "https://idp.example.test", "client_id": "writ"} | provider
    login = {"type": "oidc", "providers": [spec]}
    return {"auth": {"authorization_server": {"enabled": True, "login": login}}}


@pytest.mark.parametrize(
    ("provider", "message"),
    [
        ({"client_secret_env": "A", "client_secret_file": "b"}, "set one of client_secret_env"),
        ({"token_endpoint_auth_method": "client_secret_basic"}, "needs a client secret"),
        ({"token_endpoint_auth_method": "none", "client_secret_env": "A"}, "takes no client secret"),
        ({"scopes": ["profile"]}, "scopes must include openid"),
        ({"id": "Corp IdP"}, "String should match pattern"),
    ],
)
def test_a_provider_config_that_cannot_work_is_refused_saying_why(
    provider: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        WritConfig.model_validate(oidc(**provider))


def test_two_providers_with_one_id_are_refused() -> None:
    config = oidc()
    providers = config["auth"]["authorization_server"]["login"]["providers"]
    providers.append(dict(providers[0]))
    with pytest.raises(ValueError, match="ids must differ"):
        WritConfig.model_validate(config)


def test_a_login_without_a_type_is_still_the_built_in_one() -> None:
    login = {"users": [{"subject": "alice"}]}
    config = WritConfig.model_validate({"auth": {"authorization_server": {"enabled": True, "login": login}}})
    assert config.auth.authorization_server.login is not None
    assert config.auth.authorization_server.login.type == "builtin"


def test_a_missing_client_secret_stops_the_start_naming_the_variable_not_the_value(tmp_path: Path) -> None:
    config = WritConfig.model_validate(
        oidc(client_secret_env="WRIT_IDP_SECRET")
        | {
            "store": {"url": f"sqlite:///{tmp_path / 'writ.db'}"},
            "privacy": {"salt_file": str(tmp_path / "s")},
        }
    )
    config.auth.authorization_server.key_file = str(tmp_path / "keys.json")
    with pytest.raises(ConfigurationError, match=r"providers\[corp\]: environment variable WRIT_IDP_SECRET"):
        build_runtime(config, environ={"PATH": "/usr/bin"})
    assert not (tmp_path / "writ.db").exists(), "refused before the store opens"


def readme_oidc_configs() -> list[str]:
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    blocks = re.findall(r"^```yaml\n(.*?)^```", readme, re.M | re.S)
    return [block for block in blocks if "type: oidc" in block]


@pytest.mark.parametrize("block", readme_oidc_configs())
def test_every_upstream_provider_example_in_the_readme_loads(block: str) -> None:
    raw = yaml.safe_load(block)
    raw.setdefault("server", {"public_url": "https://writ.example.com"})
    config = WritConfig.model_validate(raw)
    login = config.auth.authorization_server.login
    assert login is not None and login.type == "oidc"
    assert settings_for(config).issuer == "https://writ.example.com/"


def test_the_readme_shows_the_general_example_and_one_for_each_provider_it_documents() -> None:
    issuers = " ".join(readme_oidc_configs())
    for issuer in ("login.microsoftonline.com", "okta.com", "/realms/", "accounts.google.com"):
        assert issuer in issuers
