"""Writ's configuration file: one YAML document, validated whole when it is loaded.

The models of the `backends`, `capabilities` and `policy` sections belong to their packages; this
module owns the rest (server, store, auth), holds them all in one model, and finds the file.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from capabilities.config import (
    BackendConfig,
    CapabilitiesConfig,
    CapabilityConfig,
    check_references,
    check_uri_prefixes,
)
from capabilities.contract import config_problems
from gateway.calls.approvals import ApprovalsConfig, WebhookConfig
from gateway.calls.rate_limits import RateLimitsConfig
from gateway.calls.reconcile import DEFAULT_RECHECKS
from gateway.calls.validation import MAX_ARGUMENT_BYTES
from gateway.errors import ConfigurationError
from policy.rules import PolicyConfig
from store.db import IDLE_TRANSACTION_TIMEOUT_S, MAX_OVERFLOW, POOL_SIZE
from store.limits import TENANT_CHARS, refusal
from store.oauth_clients import Liveness

DEFAULT_STATE_DIR = Path(".writ")
DEMO_CONFIG = DEFAULT_STATE_DIR / "demo.yaml"
CONFIG_FILES = (Path("writ.yaml"), DEMO_CONFIG)
"""Where a config is looked for, in the directory Writ starts in, after `-c` and $WRIT_CONFIG."""


# Here, not in gateway.telemetry, so that reading a config loads no OpenTelemetry SDK (and no
# docstring: it would change the published schema).
class TelemetryConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    exporter: Literal["none", "console", "otlp"] = "none"
    endpoint: str | None = None
    """OTLP/HTTP endpoint, e.g. http://collector:4318 (default: the OTEL_EXPORTER_OTLP_ENDPOINT variable)."""
    service_name: str = "writ"
    include_arguments: bool = False


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ServerConfig(_Section):
    host: str = "127.0.0.1"
    port: int = 8080
    public_url: str | None = None
    """The URL clients use to reach Writ (the OAuth resource is `{public_url}/mcp`)."""
    allowed_hosts: list[str] | None = None
    """Host headers accepted on /mcp (DNS-rebinding protection); defaults to localhost when bound there."""
    allowed_origins: list[str] | None = None
    """Origin headers accepted on /mcp with `allowed_hosts` (browser-based clients send one); default:
    the origin of `public_url`. A request without an Origin (not from a browser) is not affected."""
    stateless_http: bool = False
    json_response: bool | None = None
    """Answer each POST with one JSON body (`true`) or an SSE stream (`false`). By default JSON unless
    an upstream MCP server is configured: what an upstream says during a call (progress, log messages,
    elicitation, sampling) reaches the client only on a stream. With a stream, a client that
    disconnects cancels its call's handler; an outcome is recorded either way."""

    http_parser: Literal["auto", "httptools", "h11"] = "auto"
    """uvicorn's HTTP/1.1 implementation: httptools when installed (`auto`), else h11."""
    header_timeout_s: float = Field(default=10.0, gt=0)
    """A client must complete a request's headers this soon after connecting, or after the previous
    response on a kept-alive connection; else the connection is closed (with 408 if it had begun one).
    uvicorn itself has no such bound: a client sending a header byte every few seconds is never cut."""
    body_timeout_s: float = Field(default=30.0, gt=0)
    """The whole request body must arrive this soon after the headers; else 408 and nothing runs.
    30 s carries the largest body /mcp accepts (4 MiB) over a link of about 1 Mbit/s."""
    keep_alive_timeout_s: int = Field(default=5, ge=1)
    """An idle kept-alive connection is closed after this long without a byte (uvicorn's default)."""
    limit_concurrency: int | None = Field(default=None, ge=1)
    """Answer 503 to requests while this many connections or requests are open (default: no cap).

    No default: the cap counts connections still sending their headers, so with one a few hundred
    stalled clients would turn every honest request away with 503 until the header timeout cut them;
    without one they are cut all the same and honest requests go on being served. Set it to bound the
    work one process takes on (memory per request) when a load balancer can retry elsewhere."""
    max_argument_bytes: int = Field(default=MAX_ARGUMENT_BYTES, ge=1024)
    """A tools/call whose arguments are larger, as compact JSON, is refused as `invalid_arguments`
    naming the limit (recorded as a digest and a preview). Arguments nest at most 64 levels."""
    forwarded_allow_ips: list[str] = Field(default_factory=list)
    """The proxies in front whose `X-Forwarded-For` and `X-Forwarded-Proto` Writ believes, as addresses
    or networks (`10.0.0.5`, `10.0.0.0/24`; `*` for any peer); uvicorn's setting of that name. Default:
    none, so the client's address (rate limits, security events) is the connection's own: a client
    able to reach the port directly could otherwise name any address it liked."""

    @field_validator("forwarded_allow_ips")
    @classmethod
    def _addresses(cls, entries: list[str]) -> list[str]:
        for entry in entries:
            if entry == "*":
                continue
            try:
                ipaddress.ip_network(entry)  # an address is a network of one
            except ValueError:
                raise ValueError(f"forwarded_allow_ips: {entry!r} is not an IP address or network") from None
        return entries

    @property
    def base_url(self) -> str:
        return (self.public_url or f"http://{self.host}:{self.port}").rstrip("/")

    @property
    def resource_url(self) -> str:
        return f"{self.base_url}/mcp"


class LogConfig(_Section):
    """Partitions of the log (README, "Partitions of the log"): each has its own head, seq and chain."""

    partition_by: Literal["none", "tenant"] = "none"
    """`none`: one partition, one total order (every log written before partitions). `tenant`: one
    partition per tenant (events of no tenant in one of their own), so writes of different tenants
    do not wait on one head. A log once partitioned stays so; every replica must say the same."""
    buckets: int = Field(default=1, ge=1, le=1024)
    """With `tenant`: partitions per tenant, by a hash of the run (or call) id."""

    @model_validator(mode="after")
    def _buckets_need_tenants(self) -> LogConfig:
        if self.buckets > 1 and self.partition_by != "tenant":
            raise ValueError("store.log.buckets partitions a tenant's log: set partition_by to tenant")
        return self


class StoreConfig(_Section):
    url: str = f"sqlite:///{DEFAULT_STATE_DIR}/writ.db"
    durable: bool = True
    """SQLite only: fsync every commit (synchronous=FULL). PostgreSQL is always durable."""
    idle_transaction_timeout_s: float = Field(default=IDLE_TRANSACTION_TIMEOUT_S, ge=0)
    """PostgreSQL only: end a session left idle inside a transaction this long (0: the server's setting).

    Every write holds the log head until it commits, so a replica frozen mid-write (SIGSTOP, a VM pause)
    would stall the writers of every replica until it woke; this bounds the stall."""
    pool_size: int = Field(default=POOL_SIZE, ge=1)
    """PostgreSQL only: connections each process keeps open to the database for its transactions
    (reads look before they run on at most 4 more, `store.db.LOOK_CONNECTIONS`)."""
    max_overflow: int = Field(default=MAX_OVERFLOW, ge=0)
    """PostgreSQL only: connections opened beyond `pool_size` under load, closed when returned."""
    log: LogConfig = Field(default_factory=LogConfig)


class WorkersConfig(_Section):
    """The background workers every replica runs: lease recovery and reconciliation (DESIGN §3)."""

    enabled: bool = True
    interval_s: float = Field(default=1.0, gt=0)
    """How often expired dispatch leases are recovered and due reconciliations tried."""
    executor_grace_s: float = Field(default=5.0, ge=0)
    """Added to a capability's timeout to bound one dispatch, whatever the executor does."""
    lease_margin_s: float = Field(default=10.0, ge=0)
    """A dispatch lease lasts the bounded dispatch plus this margin for recording its outcome."""
    reconcile_max_attempts: int = Field(default=5, ge=1)
    reconcile_backoff_s: float = Field(default=2.0, ge=0)
    reconcile_backoff_max_s: float = Field(default=300.0, ge=0)
    reconcile_recheck_after: list[float] = Field(
        default_factory=lambda: list(DEFAULT_RECHECKS), max_length=10
    )
    """When a call settled `failed` because its backend had no effect after the commit horizon is looked
    up again, in case the backend committed past it: in multiples of the capability's commit horizon,
    counted from the end of the call's horizon (`[1, 3, 10]`: one, three and ten horizons later).
    Ascending and above 0; `[]` turns re-checks off."""

    @field_validator("reconcile_recheck_after")
    @classmethod
    def _ascending(cls, factors: list[float]) -> list[float]:
        if any(factor <= 0 for factor in factors):
            raise ValueError("reconcile_recheck_after: each entry must be above 0 (multiples of the horizon)")
        if any(later <= earlier for earlier, later in zip(factors, factors[1:], strict=False)):
            raise ValueError(f"reconcile_recheck_after: {factors} must be strictly ascending")
        return factors


class ConfirmationsConfig(_Section):
    """Confirmation rounds of `confirm` capabilities (MCP 2026-07-28 input-required)."""

    ttl_s: float = Field(default=600.0, gt=0)
    """How long the user has to answer; the round's sealed state and the call's confirmation expire."""
    key_file: str | None = None
    """Secrets that seal each round's `requestState`, one per line, each at least 32 bytes: the first
    seals, every line unseals (add a new first line to rotate, drop the old one after `ttl_s`). Give
    every replica behind one URL the same file. Without one, each process makes its own key at start,
    so a round begun before a restart or at another replica is refused and nothing runs."""


class ClaimMapping(_Section):
    subject: str = "sub"
    tenant: str = "tenant"
    roles: str = "roles"
    groups: str = "groups"
    scopes: str = "scope"
    client_id: str = "client_id"
    default_tenant: str = "default"

    @field_validator("default_tenant")
    @classmethod
    def _storable(cls, tenant: str) -> str:
        message = refusal("the tenant", tenant, TENANT_CHARS)
        if message is not None:
            raise ValueError(message)
        return tenant


class DevIssuerConfig(_Section):
    enabled: bool = False
    """Off unless asked for: when on, anyone who can read `key_file` (or run `writ token` in this
    directory) mints tokens with any subject, tenant and role. `writ demo` turns it on."""
    key_file: str = str(DEFAULT_STATE_DIR / "dev-issuer.jwk")
    token_ttl_s: int = 8 * 3600


class IntrospectionConfig(_Section):
    """RFC 7662 introspection of opaque tokens, authenticated as a client of the issuer."""

    endpoint: str | None = None
    """Default: the issuer metadata's `introspection_endpoint`."""
    client_id: str
    client_secret_env: str | None = None
    client_secret_file: str | None = None
    cache_s: float = Field(default=30.0, ge=0)
    """How long an answer (active or not) is reused; never past the token's own `exp`."""

    @model_validator(mode="after")
    def _one_secret(self) -> IntrospectionConfig:
        if (self.client_secret_env is None) == (self.client_secret_file is None):
            raise ValueError("set exactly one of client_secret_env, client_secret_file")
        return self


class IssuerConfig(_Section):
    """One trusted authorization server."""

    issuer: str
    jwks_uri: str | None = None
    """Where its signing keys are; without it they are found through the issuer's metadata."""
    discovery: bool = True
    """Read `/.well-known/openid-configuration` (or RFC 8414 `oauth-authorization-server`)."""
    audience: str | None = None
    """The `aud` its tokens must carry; default: this server's resource URL (`{public_url}/mcp`)."""
    algorithms: list[str] | None = None
    """Allowed `alg` values for this issuer; default: `auth.algorithms`."""
    introspection: IntrospectionConfig | None = None

    @model_validator(mode="after")
    def _findable(self) -> IssuerConfig:
        if self.jwks_uri is None and not self.discovery and self.introspection is None:
            raise ValueError(f"issuer {self.issuer}: set jwks_uri, discovery: true, or introspection")
        if self.introspection and self.introspection.endpoint is None and not self.discovery:
            raise ValueError(f"issuer {self.issuer}: introspection needs an endpoint without discovery")
        return self


class LoginUser(_Section):
    """Someone the built-in login page lets sign in, with the identity their tokens carry."""

    subject: str
    tenant: str = "default"
    roles: list[str] = Field(default_factory=list)
    groups: list[str] = Field(default_factory=list)
    name: str | None = None
    """Shown on the login page (default: the subject)."""

    @field_validator("tenant")
    @classmethod
    def _storable(cls, tenant: str) -> str:
        message = refusal("the tenant", tenant, TENANT_CHARS)
        if message is not None:
            raise ValueError(message)
        return tenant


class BuiltinLoginConfig(_Section):
    """The built-in login: a page listing `users`, anyone who reaches it signs in as one of them.

    For `writ demo` and trials on one machine, never for production: no password is asked."""

    type: Literal["builtin"] = "builtin"
    users: list[LoginUser] = Field(min_length=1)
    remote: bool = False
    """Serve it on a public URL off loopback too. Anyone who reaches the page signs in as any listed
    user (an admin included), so only for a trial behind access control of your own."""


class UpstreamClaims(_Section):
    """Where a provider's ID token says who someone is. A name with dots reaches into nested claims
    (`realm_access.roles`); a claim the token leaves out is empty (the tenant: `default_tenant`)."""

    subject: str = "sub"
    tenant: str | None = None
    """Default: none read, every user of this provider is in `default_tenant` (Entra ID: `tid`)."""
    roles: str = "roles"
    groups: str = "groups"
    default_tenant: str = "default"
    default_roles: list[str] = Field(default_factory=list)
    """Roles every user of this provider holds besides those its token names (Google names none)."""

    @field_validator("default_tenant")
    @classmethod
    def _storable(cls, tenant: str) -> str:
        message = refusal("the tenant", tenant, TENANT_CHARS)
        if message is not None:
            raise ValueError(message)
        return tenant


class UpstreamProviderConfig(_Section):
    """An OpenID provider people sign in at, with Writ's own static registration there.

    Register `{public_url}/authorize/oidc/{id}/callback` as the redirect URI of a web application."""

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,31}$")
    """Names the provider in Writ's URLs (`/authorize/oidc/{id}/callback`): lower case, digits, - and _."""
    name: str | None = None
    """Shown on the page that lets a person choose a provider (default: the id)."""
    issuer: str
    """Its issuer exactly as its discovery document and ID tokens say it."""
    client_id: str
    client_secret_env: str | None = None
    client_secret_file: str | None = None
    token_endpoint_auth_method: Literal["client_secret_basic", "client_secret_post", "none"] | None = None
    """Default: `client_secret_basic` with a secret, `none` (a public client, PKCE only) without."""
    scopes: list[str] = Field(default_factory=lambda: ["openid", "profile", "email"])
    claims: UpstreamClaims = Field(default_factory=UpstreamClaims)
    required_claims: dict[str, str | bool | list[str]] = Field(default_factory=dict)
    """Claims an ID token must carry with this value (or one of these), else the sign-in is refused:
    e.g. `{hd: example.com}` for Google, where any Google account could sign in otherwise, or
    `{email_verified: true}` when the subject is the `email` claim."""
    algorithms: list[str] | None = None
    """Allowed ID token `alg` values; default: `auth.algorithms`."""

    @model_validator(mode="after")
    def _secret(self) -> UpstreamProviderConfig:
        if self.client_secret_env is not None and self.client_secret_file is not None:
            raise ValueError(f"provider {self.id}: set one of client_secret_env, client_secret_file")
        secret = self.client_secret_env is not None or self.client_secret_file is not None
        if self.token_endpoint_auth_method not in (None, "none") and not secret:
            raise ValueError(f"provider {self.id}: {self.token_endpoint_auth_method} needs a client secret")
        if self.token_endpoint_auth_method == "none" and secret:
            raise ValueError(f"provider {self.id}: token_endpoint_auth_method none takes no client secret")
        if "openid" not in self.scopes:
            raise ValueError(f"provider {self.id}: scopes must include openid")
        return self


class OidcLoginConfig(_Section):
    """Sign in through one or more upstream OpenID providers (authorization code with PKCE there);
    with several, a page lets the person choose."""

    type: Literal["oidc"]
    providers: list[UpstreamProviderConfig] = Field(min_length=1)

    @model_validator(mode="after")
    def _distinct(self) -> OidcLoginConfig:
        ids = [p.id for p in self.providers]
        if len(set(ids)) != len(ids):
            raise ValueError(f"login.providers: ids must differ ({', '.join(ids)})")
        return self


def _login_type(value: Any) -> str:
    found = value.get("type", "builtin") if isinstance(value, dict) else getattr(value, "type", "builtin")
    return str(found)


LoginConfig = Annotated[
    Annotated[BuiltinLoginConfig, Tag("builtin")] | Annotated[OidcLoginConfig, Tag("oidc")],
    Discriminator(_login_type),
]


class ClientMetadataDocumentsConfig(_Section):
    """Client ID Metadata Documents (MCP authorization 2025-11-25): a client whose `client_id` is an
    https URL is known by the JSON document served there, fetched with the limits below."""

    enabled: bool = True
    timeout_s: float = Field(default=5.0, gt=0, le=30)
    """The whole fetch (connect, TLS, headers and body) must finish within this."""
    max_bytes: int = Field(default=5120, ge=256, le=1_048_576)
    """A larger document is refused (the draft suggests 5 KB)."""
    cache_min_s: int = Field(default=60, ge=0)
    """A document is used this long at least, whatever its Cache-Control says (no-store included)."""
    cache_max_s: int = Field(default=86400, ge=0)
    """And at most this long, however long its Cache-Control allows."""
    cache_default_s: int = Field(default=300, ge=0)
    """How long a document with no Cache-Control max-age is used (within the bounds above)."""
    fetches_per_minute: float = Field(default=30.0, gt=0)
    """Fetches of documents from one host (cache misses), shared by replicas through the store: Writ
    is not made to hammer a site on behalf of whoever starts sign-ins."""
    fetch_burst: int = Field(default=30, ge=1)
    allow_private_addresses: bool = False
    """Fetch from loopback, private, link-local and other non-public addresses too. For tests and for
    clients inside one's own network only: it lets anyone who can start a sign-in make Writ fetch there."""
    ca_file: str | None = None
    """A PEM file of certificate authorities to trust for the fetch instead of the system's."""

    @model_validator(mode="after")
    def _bounds(self) -> ClientMetadataDocumentsConfig:
        if self.cache_min_s > self.cache_max_s:
            raise ValueError("client_metadata_documents: cache_min_s is more than cache_max_s")
        return self


class AuthorizationServerConfig(_Section):
    """Writ's own OAuth authorization server for MCP clients (RFC 8414, 7591, 7636, 7009, 8707).

    Served at the gateway's own URL: `/.well-known/oauth-authorization-server`, `/authorize`, `/token`,
    `/register`, `/revoke`, `/jwks.json`; the RFC 9728 metadata names it. Its access tokens are ES256
    JWTs for `{public_url}/mcp`, accepted by this gateway like any trusted issuer's."""

    enabled: bool = False
    key_file: str = str(DEFAULT_STATE_DIR / "oauth-keys.json")
    """The signing keys (made, mode 0600, on first use; give every replica the same file): the first
    signs, all are published in /jwks.json and verify, so a new key can be put first while the old
    one still verifies the tokens it signed (`gateway.oauth.keys.rotate`)."""
    client_metadata_documents: ClientMetadataDocumentsConfig = Field(
        default_factory=ClientMetadataDocumentsConfig
    )
    access_token_ttl_s: int = Field(default=900, ge=5)
    refresh_token_ttl_s: int = Field(default=30 * 86400, ge=60)
    sign_in_max_age_s: int = Field(default=86400, ge=300)
    """How long one sign-in lasts, its refreshes included, counted from the login: past it a refresh
    gets `invalid_grant` and the person signs in again. Writ cannot ask an upstream provider on a
    refresh whether the person is still there and what their roles are now, so this bounds how stale
    a token's identity can be (the built-in login looks its users up on every refresh as well)."""
    code_ttl_s: int = Field(default=60, ge=5, le=600)
    login_ttl_s: int = Field(default=600, ge=30)
    """How long a sign-in (login, then consent) may take before the client must start over."""
    registrations_per_minute: float = Field(default=10.0, gt=0)
    """Dynamic client registrations allowed per client IP address (shared by replicas via the store)."""
    registration_burst: int = Field(default=20, ge=1)
    scopes: list[str] | None = None
    """The scopes clients may ask for (default: `auth.required_scopes`); a token gets those asked
    for, or all of these when none are asked for."""
    login: LoginConfig | None = None
    """How the person behind a sign-in is identified (required when enabled)."""

    def liveness(self) -> Liveness:
        """How long a sign-in without a refresh token counts as live (the admin's view of clients)."""
        return Liveness(self.access_token_ttl_s, self.code_ttl_s)

    @model_validator(mode="after")
    def _login(self) -> AuthorizationServerConfig:
        if self.enabled and self.login is None:
            raise ValueError("authorization_server: set `login` (who may sign in) when it is enabled")
        return self


class AuthConfig(_Section):
    dev_issuer: DevIssuerConfig = Field(default_factory=DevIssuerConfig)
    authorization_server: AuthorizationServerConfig = Field(default_factory=AuthorizationServerConfig)
    issuers: list[IssuerConfig] = Field(default_factory=list)
    jwks_max_age_s: float = Field(default=300.0, gt=0)
    """How long fetched signing keys are used before they are fetched again."""
    jwks_min_refetch_s: float = Field(default=30.0, ge=0)
    """At most one fetch per issuer per this interval, however many unknown `kid`s arrive."""
    http_timeout_s: float = Field(default=5.0, gt=0)
    claims: ClaimMapping = Field(default_factory=ClaimMapping)
    required_scopes: list[str] = Field(default_factory=list)
    leeway_s: int = 30
    algorithms: list[str] = Field(default_factory=lambda: ["ES256", "RS256", "EdDSA", "PS256", "ES384"])


class PrivacyConfig(_Section):
    salt_file: str = str(DEFAULT_STATE_DIR / "redaction.salt")


class CheckpointsConfig(_Section):
    """Signed checkpoints of the log, kept outside the database (`writ audit checkpoint`)."""

    enabled: bool = False
    """Every replica writes checkpoints while it runs (`writ demo` turns this on): when `every_events`
    events were appended since its last one, or `every_s` passed and any were; never when idle."""
    every_events: int = Field(default=1000, ge=1)
    every_s: float = Field(default=60.0, gt=0)

    directory: str = str(DEFAULT_STATE_DIR / "checkpoints")
    """Where checkpoints are appended, one file per host and day, and where `writ audit verify` reads
    them by default. Put it where the database's operators cannot rewrite it (see the README)."""
    key_file: str = str(DEFAULT_STATE_DIR / "checkpoint-key.jwk")
    """The Ed25519 private key (made, mode 0600, on first use). Never in the database."""
    trusted_keys: str = str(DEFAULT_STATE_DIR / "checkpoint-keys.jwks")
    """The public keys checkpoints verify against: a JWKS, appended to on rotation, never pruned."""
    webhook: WebhookConfig | None = None
    """Each checkpoint the gateway writes is also POSTed here through the outbox (signed with the
    secret in `secret_env`, retried, dead-lettered), e.g. to a store in another account."""


class SecurityEventsConfig(_Section):
    """`security.*` events: failed authentications, unknown tools, refusals at the edge (rate-bounded)."""

    enabled: bool = True
    window_s: float = Field(default=60.0, gt=0)
    """At most one event per kind, source and window, carrying the count of refusals it stands for."""
    max_keys: int = Field(default=1000, ge=1)
    """Keys (kind, source, identity) tracked at once; past it, new ones are counted under `other`."""


class AuditConfig(_Section):
    checkpoints: CheckpointsConfig = Field(default_factory=CheckpointsConfig)
    security_events: SecurityEventsConfig = Field(default_factory=SecurityEventsConfig)


class WritConfig(_Section):
    """The whole configuration file."""

    server: ServerConfig = Field(default_factory=ServerConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    auth: AuthConfig = Field(default_factory=AuthConfig)
    privacy: PrivacyConfig = Field(default_factory=PrivacyConfig)
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)
    workers: WorkersConfig = Field(default_factory=WorkersConfig)
    approvals: ApprovalsConfig = Field(default_factory=ApprovalsConfig)
    confirmations: ConfirmationsConfig = Field(default_factory=ConfirmationsConfig)
    rate_limits: RateLimitsConfig = Field(default_factory=RateLimitsConfig)
    audit: AuditConfig = Field(default_factory=AuditConfig)
    backends: dict[str, BackendConfig] = Field(default_factory=dict)
    capabilities: list[CapabilityConfig] = Field(default_factory=list)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    """Inline rules; its CEL conditions are compiled when the gateway is built."""
    policy_file: str | None = None
    """A YAML file with the policy (`rules:`), re-read when it changes; excludes an inline `policy:`."""
    source: str | None = Field(default=None, exclude=True)
    """The file this configuration was read from, for messages."""

    @model_validator(mode="after")
    def _one_policy(self) -> WritConfig:
        if self.policy_file is not None and self.policy.rules:
            raise ValueError("set either policy (inline rules) or policy_file, not both")
        return self

    @model_validator(mode="after")
    def _references(self) -> WritConfig:
        check_references(self.backends, self.capabilities)
        check_uri_prefixes(self.backends)
        return self

    @property
    def capabilities_config(self) -> CapabilitiesConfig:
        """The `backends` and `capabilities` sections, as the registry is built from them."""
        return CapabilitiesConfig(backends=self.backends, capabilities=self.capabilities)


def json_schema() -> dict[str, Any]:
    """The JSON schema of the configuration file, for editors (`writ config schema`)."""
    schema = WritConfig.model_json_schema()
    schema["properties"].pop("source", None)  # set by load_config, never read from the file
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


def find_config_file(explicit: str | None) -> Path | None:
    """`-c FILE`, else $WRIT_CONFIG, ./writ.yaml, the demo's ./.writ/demo.yaml; None means defaults."""
    if explicit:
        return Path(explicit)
    if env := os.environ.get("WRIT_CONFIG"):
        return Path(env)
    for candidate in CONFIG_FILES:
        if candidate.exists():
            return candidate
    return None


def no_config_file() -> str:
    """What to say when `find_config_file` found none: where it looked, and what that means."""
    looked = ", ".join(str(path.absolute()) for path in CONFIG_FILES)
    return (
        f"no config file found (no -c, $WRIT_CONFIG unset, none of {looked}); "
        "serving the defaults: no backends, no capabilities"
    )


def load_config(path: str | Path | None) -> WritConfig:
    """Read and validate a configuration file; None gives the embedded defaults.

    Raises:
        ConfigurationError: the file is missing, is not YAML, or fails validation.
    """
    if path is None:
        return WritConfig()
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError as exc:
        raise ConfigurationError(f"config file not found: {path}") from exc
    except yaml.YAMLError as exc:
        raise ConfigurationError(f"{path} is not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigurationError(f"{path}: the top level must be a mapping")
    try:
        config = WritConfig.model_validate(raw)
    except ValidationError as exc:
        problems = config_problems(exc.errors(), raw)
        raise ConfigurationError(f"{path}: invalid config:\n  " + "\n  ".join(problems)) from None
    return config.model_copy(update={"source": str(path)})
