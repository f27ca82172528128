"""An upstream OpenID provider, as Writ's sign-in uses it: Writ is a confidential (or public) client
with a static registration there, and asks it who the person at the browser is.

Discovery and the JWKS go through the trusted issuers' machinery (`gateway.auth.issuers`: cached,
rate-limited refetch on an unknown `kid`); the code is exchanged with PKCE S256; the ID token is
verified with joserfc (signature, `iss`, `aud` = the client id, `azp` when it has several audiences,
`exp`, `iat`, `nonce`) and its claims mapped to the user a sign-in grants for.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote_plus, urlencode

import httpx2
from joserfc import jws, jwt
from joserfc.errors import JoseError, MissingClaimError

from capabilities.contract import ConfigError
from capabilities.credentials import read_secret
from gateway.auth.issuers import HttpFactory, IssuerMetadata, IssuerUnavailable, RemoteKeys
from gateway.auth.tokens import ClaimsRejected, allowed_algorithms, principal_from_claims
from gateway.config import ClaimMapping, OidcLoginConfig, UpstreamClaims, WritConfig
from gateway.errors import AuthenticationError, ConfigurationError
from store.oauth import Grantee

logger = logging.getLogger(__name__)

AuthMethod = Literal["client_secret_basic", "client_secret_post", "none"]


class UpstreamRefused(AuthenticationError):
    """The provider's answer does not establish who signed in (the client hears `access_denied`)."""


@dataclass(frozen=True, slots=True)
class Attempt:
    """What one redirect to the provider must be matched against when the browser comes back."""

    provider: str
    state: str
    nonce: str
    verifier: str

    @classmethod
    def start(cls, provider: str) -> Attempt:
        return cls(provider, secrets.token_urlsafe(24), secrets.token_urlsafe(24), secrets.token_urlsafe(48))

    @property
    def challenge(self) -> str:
        digest = hashlib.sha256(self.verifier.encode()).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")


@dataclass(frozen=True, slots=True)
class Registration:
    """Writ's registration at the provider, and what it reads of its tokens."""

    id: str
    name: str
    issuer: str
    client_id: str
    client_secret: str | None
    auth_method: AuthMethod
    scopes: Sequence[str]
    claims: UpstreamClaims
    required_claims: Mapping[str, str | bool | list[str]]
    algorithms: Sequence[str]


class UpstreamProvider:
    def __init__(
        self,
        registration: Registration,
        *,
        redirect_uri: str,
        http: HttpFactory,
        metadata: IssuerMetadata,
        keys: RemoteKeys,
        leeway_s: int,
    ) -> None:
        self.registration = registration
        self.redirect_uri = redirect_uri
        self._http = http
        self._metadata = metadata
        self._keys = keys
        self._leeway_s = leeway_s

    @property
    def id(self) -> str:
        return self.registration.id

    @property
    def name(self) -> str:
        return self.registration.name

    async def authorization_url(self, attempt: Attempt) -> str:
        """Where the browser goes to sign in at the provider.

        Raises:
            IssuerUnavailable: its discovery document cannot be had, or names no authorization endpoint.
        """
        endpoint = await self._endpoint("authorization_endpoint")
        query = {
            "response_type": "code",
            "client_id": self.registration.client_id,
            "redirect_uri": self.redirect_uri,
            "scope": " ".join(self.registration.scopes),
            "state": attempt.state,
            "nonce": attempt.nonce,
            "code_challenge": attempt.challenge,
            "code_challenge_method": "S256",
        }
        return f"{endpoint}{'&' if '?' in endpoint else '?'}{urlencode(query)}"

    async def sign_in(self, code: str, attempt: Attempt) -> Grantee:
        """Exchange the code, verify the ID token, and map its claims to the user.

        Raises:
            IssuerUnavailable: the provider cannot be reached, or its token endpoint fails.
            UpstreamRefused: the provider refused the code, or its ID token is not acceptable.
        """
        claims = await self._verified(await self._id_token(code, attempt), attempt)
        return self._grantee(claims)

    async def _endpoint(self, name: str) -> str:
        url = (await self._metadata.get()).get(name)
        if not isinstance(url, str) or not url:
            raise IssuerUnavailable(f"provider {self.id}: its discovery document has no {name}")
        return url

    async def _id_token(self, code: str, attempt: Attempt) -> str:
        registration = self.registration
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": self.redirect_uri,
            "code_verifier": attempt.verifier,
        }
        headers = {"Accept": "application/json"}
        if registration.auth_method == "client_secret_basic":
            assert registration.client_secret is not None
            # RFC 6749 §2.3.1: each part form-encoded before they are joined and base64-encoded.
            pair = f"{quote_plus(registration.client_id)}:{quote_plus(registration.client_secret)}"
            headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        else:
            form["client_id"] = registration.client_id
            if registration.auth_method == "client_secret_post":
                assert registration.client_secret is not None
                form["client_secret"] = registration.client_secret
        url = await self._endpoint("token_endpoint")
        try:
            async with self._http() as client:
                response = await client.post(url, data=form, headers=headers)
        except httpx2.HTTPError as exc:
            raise IssuerUnavailable(
                f"provider {self.id}: token endpoint {url} is unreachable ({type(exc).__name__})"
            ) from exc
        try:
            body = response.json()
        except ValueError:
            body = None
        if response.status_code >= 500 or not isinstance(body, dict):
            raise IssuerUnavailable(
                f"provider {self.id}: token endpoint {url} answered HTTP {response.status_code}"
            )
        if response.status_code != 200:
            error = str(body.get("error", "?"))[:100]
            logger.warning(
                "provider %s refused the code: %s (%s)",
                self.id,
                error,
                str(body.get("error_description", ""))[:300],
            )
            raise UpstreamRefused(f"provider {self.id} refused the code: {error}")
        token = body.get("id_token")
        if not isinstance(token, str) or not token:
            raise UpstreamRefused(
                f"provider {self.id}: its token response has no id_token (is openid asked for?)"
            )
        return token

    async def _verified(self, token: str, attempt: Attempt) -> Mapping[str, Any]:
        registration = self.registration
        try:
            header = dict(jws.extract_compact(token.encode()).protected)
        except (JoseError, ValueError) as exc:
            raise UpstreamRefused(
                f"provider {self.id}: the ID token is malformed ({type(exc).__name__})"
            ) from exc
        kid = header.get("kid")
        keys = await self._keys.key_set(kid if isinstance(kid, str) else None)
        try:
            decoded = jwt.decode(token, keys, algorithms=list(registration.algorithms))
            jwt.JWTClaimsRegistry(
                leeway=self._leeway_s,
                iss={"essential": True, "value": registration.issuer},
                aud={"essential": True, "value": registration.client_id},
                exp={"essential": True},
                iat={"essential": True},
                sub={"essential": True},
                nonce={"essential": True, "value": attempt.nonce},
            ).validate(decoded.claims)
        except MissingClaimError as exc:
            raise UpstreamRefused(f"provider {self.id}: the ID token has no {exc.claim} claim") from exc
        except (JoseError, ValueError) as exc:
            claim = getattr(exc, "claim", None)
            what = f"its {claim} claim is not accepted" if claim else f"it does not verify ({exc})"
            raise UpstreamRefused(f"provider {self.id}: the ID token is refused: {what}") from exc
        claims = decoded.claims
        aud = claims.get("aud")
        if isinstance(aud, list) and len(aud) > 1 and claims.get("azp") != registration.client_id:
            # OpenID Connect Core §3.1.3.7: with several audiences, the token must be issued to us.
            raise UpstreamRefused(
                f"provider {self.id}: the ID token is refused: its azp claim is not accepted"
            )
        for name, wanted in registration.required_claims.items():
            allowed: list[str | bool] = list(wanted) if isinstance(wanted, list) else [wanted]
            got = _claim(claims, name)
            if not any(type(value) is type(got) and value == got for value in allowed):  # true is not 1
                raise UpstreamRefused(
                    f"provider {self.id}: the ID token's {name} claim is not one allowed here"
                )
        return claims

    def _grantee(self, claims: Mapping[str, Any]) -> Grantee:
        mapping = self.registration.claims
        for name in (mapping.groups, mapping.roles):
            if _claim(claims, name) is None and name in (claims.get("_claim_names") or {}):
                # Entra ID's overage: too many groups to list, a Graph URL instead. Signing in without
                # them could slip past a rule that denies by group.
                raise UpstreamRefused(
                    f"provider {self.id}: the ID token lists no {name} but points elsewhere for them "
                    "(too many to list); map app roles instead, or filter the groups the provider emits"
                )
        flat = {
            "sub": _claim(claims, mapping.subject),
            "tenant": _claim(claims, mapping.tenant) if mapping.tenant else None,
            "roles": _claim(claims, mapping.roles),
            "groups": _claim(claims, mapping.groups),
        }
        try:
            principal = principal_from_claims(flat, ClaimMapping(default_tenant=mapping.default_tenant))
        except ClaimsRejected as exc:
            raise UpstreamRefused(f"provider {self.id}: {exc}") from exc
        roles = tuple(sorted(principal.roles | set(mapping.default_roles)))
        return Grantee(principal.subject, principal.tenant, roles, tuple(sorted(principal.groups)))


def _claim(claims: Mapping[str, Any], name: str) -> Any:
    """A claim by its name, or by a dotted path into nested objects when no claim has that name."""
    if name in claims:
        return claims[name]
    value: Any = claims
    for part in name.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def upstream_providers(
    config: WritConfig, *, environ: Mapping[str, str], base_dir: Path | None, http: HttpFactory
) -> list[UpstreamProvider]:
    """The providers of `login: {type: oidc}`, their secrets read (none for another login).

    Raises:
        ConfigurationError: a client secret is missing, or a provider is Writ itself.
    """
    login = config.auth.authorization_server.login
    if not isinstance(login, OidcLoginConfig):
        return []
    auth = config.auth
    base = config.server.base_url
    providers = []
    for spec in login.providers:
        owner = f"auth.authorization_server.login.providers[{spec.id}]"
        if spec.issuer.rstrip("/") == base:
            raise ConfigurationError(f"{owner}: {spec.issuer} is Writ itself")
        secret = None
        if spec.client_secret_env is not None or spec.client_secret_file is not None:
            try:
                secret = read_secret(
                    env=spec.client_secret_env,
                    file=spec.client_secret_file,
                    owner=owner,
                    environ=environ,
                    base_dir=base_dir,
                )
            except ConfigError as exc:
                raise ConfigurationError(str(exc)) from exc
        method: AuthMethod = spec.token_endpoint_auth_method or ("client_secret_basic" if secret else "none")
        metadata = IssuerMetadata(
            spec.issuer, http=http, retry_s=auth.jwks_min_refetch_s, clock=time.monotonic
        )
        keys = RemoteKeys(
            spec.issuer,
            http=http,
            metadata=metadata,
            max_age_s=auth.jwks_max_age_s,
            min_refetch_s=auth.jwks_min_refetch_s,
        )
        registration = Registration(
            id=spec.id,
            name=spec.name or spec.id,
            issuer=spec.issuer,
            client_id=spec.client_id,
            client_secret=secret,
            auth_method=method,
            scopes=tuple(spec.scopes),
            claims=spec.claims,
            required_claims=dict(spec.required_claims),
            algorithms=tuple(allowed_algorithms(spec.algorithms or auth.algorithms)),
        )
        redirect_uri = f"{base}/authorize/oidc/{spec.id}/callback"
        providers.append(
            UpstreamProvider(
                registration,
                redirect_uri=redirect_uri,
                http=http,
                metadata=metadata,
                keys=keys,
                leeway_s=auth.leeway_s,
            )
        )
    return providers
