"""The composition root: the only place that builds concrete objects and wires them together.

`build_runtime` makes the store, registry, policy, verifier and pipeline from a config; `build_app`
puts the HTTP faces around them (MCP at /mcp, RFC 9728 metadata, health, API) with one lifespan.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import anyio.to_thread
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser, RequireAuthMiddleware
from mcp.server.auth.routes import (
    build_resource_metadata_url,
    cors_middleware,
    create_protected_resource_routes,
)
from mcp.server.request_state import RequestStateSecurity
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import AnyHttpUrl
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from capabilities.contract import CapabilityError
from capabilities.registry import Registry
from gateway.api.clients import client_routes
from gateway.api.principals import principal_routes
from gateway.api.retries import retry_routes
from gateway.api.routes import api_routes
from gateway.api.runs import run_routes
from gateway.audit.checkpointer import Checkpointer
from gateway.audit.checkpoints import CheckpointSigner
from gateway.audit.security import NoSecurityEvents, SecurityEvents, SecuritySink
from gateway.auth.dev_issuer import DevIssuer
from gateway.auth.issuers import IssuerUnavailable, StaticKeys, TrustedIssuer
from gateway.auth.tokens import JwtVerifier, TokenRejected, principal_from_claims
from gateway.auth.trust import http_factory, trusted_issuers
from gateway.calls.actions import Redactor
from gateway.calls.approvals import Decisions, WebhookConfig
from gateway.calls.authorize import PolicyLike
from gateway.calls.catalogue import Catalogue
from gateway.calls.dispatch import Dispatcher
from gateway.calls.faults import FaultPoints
from gateway.calls.outbox import Notifier
from gateway.calls.periodic import Wake, run_periodically
from gateway.calls.pipeline import CallPipeline
from gateway.calls.policy_source import WatchedPolicyFile, policy_provider, vet_tool_names
from gateway.calls.rate_limits import RateLimiter
from gateway.calls.reconcile import ReconcilePolicy, Reconciler
from gateway.calls.resume import Resumer
from gateway.calls.retries import retry_call
from gateway.calls.tracing import FirstTrace, first_trace_of, no_first_trace
from gateway.calls.workers import Workers, worker_id
from gateway.clock import Clock, SharedClock, system_clock
from gateway.config import BuiltinLoginConfig, ClientMetadataDocumentsConfig, OidcLoginConfig, WritConfig
from gateway.console import console_routes
from gateway.console.sessions import SignIn
from gateway.console.views import InForce
from gateway.errors import ConfigurationError
from gateway.http.bearer import bearer_backend, refused_token
from gateway.http.edge import Edge
from gateway.mcp import rounds as mcp_rounds
from gateway.mcp.parked import Parked
from gateway.mcp.server import STATUS_TOOL, build_mcp_server
from gateway.oauth import settings_for
from gateway.oauth.documents import ClientDocuments, HttpsFetcher
from gateway.oauth.keys import SigningKeys
from gateway.oauth.login import BuiltinLogin, ConfiguredUsers, LoginStep
from gateway.oauth.oidc_login import AttemptCookies, OidcLogin
from gateway.oauth.pages import Pages
from gateway.oauth.routes import AuthorizationRoutes
from gateway.oauth.server import WritAuthorizationServer
from gateway.oauth.signin import SigninCookies
from gateway.oauth.upstream import UpstreamProvider, upstream_providers
from gateway.opening import dev_issuer_for, open_store
from gateway.startup_errors import known_cause
from gateway.telemetry import Telemetry, build_telemetry
from policy.engine import Policy
from policy.model import PolicyError, Principal
from store.model import StoreError
from store.ports import OAuthGrants
from store.queues import TOPIC_APPROVAL_REQUIRED, TOPIC_CHECKPOINT
from store.rate_limits import Bucket
from store.store import Store

logger = logging.getLogger(__name__)
CONSOLE = "writ-console"
"""The producer the web console records its decisions and resolutions as."""


@dataclass
class Runtime:
    """Everything a running gateway holds, built once from the config."""

    config: WritConfig
    store: Store
    registry: Registry
    policy: Policy
    pipeline: CallPipeline
    verifier: JwtVerifier
    dev_issuer: DevIssuer | None
    telemetry: Telemetry
    dispatcher: Dispatcher
    """The one dispatcher the pipeline and the workers share."""
    policy_source: Callable[[], PolicyLike]
    """The policy in force now, re-read on every use, so a reload takes effect at once."""
    clock: Clock
    """The one clock every component reads business time from."""
    sealing: RequestStateSecurity | None = None
    """How confirmation rounds' `requestState` is sealed (shared keys, or this process's own)."""
    decisions: Decisions | None = None
    """Approval decisions (API); the resume worker in `background` executes approved calls."""
    console_decisions: Decisions | None = None
    """The same, recorded in the console's name."""
    authorization_server: WritAuthorizationServer | None = None
    """Writ's own OAuth authorization server, when `auth.authorization_server` is enabled."""
    upstream: list[UpstreamProvider] = field(default_factory=list)
    """The OpenID providers people sign in at, when its login is `type: oidc`."""
    security: SecuritySink = field(default_factory=NoSecurityEvents)
    """Where refusals are noted as rate-bounded `security.*` events (`audit.security_events`)."""
    background: list[Callable[[], Coroutine[Any, Any, None]]] = field(default_factory=list)
    """Workers run while the runtime runs: lease recovery and reconciliation, approvals (resume,
    expiry), outbox delivery; each one a `run_periodically` loop."""

    def principal_from_claims(self, claims: dict[str, Any]) -> Principal:
        return principal_from_claims(claims, self.config.auth.claims)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Runtime]:
        """Start executors (and discover upstream tools), then check every schema; close on exit."""
        await self.registry.start()
        try:
            in_force = self.policy_source()
            if isinstance(in_force, Policy):  # checked now that every upstream's tools are known
                try:
                    vet_tool_names(in_force, self.registry.capabilities())
                except PolicyError as exc:
                    where = self.config.source or "config"
                    if self.config.policy_file is not None:  # the file to correct is the policy's
                        where = f"{where}: policy_file {self.config.policy_file}"
                    raise ConfigurationError(f"{where}: {exc}") from exc
            self.pipeline.prepare()
            async with anyio.create_task_group() as workers:
                # The workers' spans (approved dispatches, reconciliations) go to this runtime's exporter.
                with self.telemetry.activated():
                    for task in self.background:
                        workers.start_soon(task)
                try:
                    yield self
                finally:
                    workers.cancel_scope.cancel()
            if isinstance(self.security, SecurityEvents):
                await _last_security_events(self.security)
        finally:
            await self.registry.close()
            # First: its last collection reads the store (the gauges of waiting calls).
            self.telemetry.shutdown()
            await anyio.to_thread.run_sync(self.store.close)


def token_verifier(
    config: WritConfig,
    dev_issuer: DevIssuer | None,
    *,
    environ: dict[str, str] | None = None,
    own: TrustedIssuer | None = None,
) -> JwtVerifier:
    """The bearer-token check of /mcp, /api and the console; the CLI checks `--token` with it too.

    `own` is Writ's authorization server, when it runs: trusted with its keys from the key file.
    """
    base_dir = Path(config.source).parent if config.source else Path.cwd()
    issuers = trusted_issuers(config.auth, dev_issuer, environ=environ or dict(os.environ), base_dir=base_dir)
    if own is not None:
        if any(i.issuer == own.issuer for i in issuers):
            raise ConfigurationError(f"auth.issuers: {own.issuer} is Writ's own authorization server")
        issuers.append(own)
    return JwtVerifier(
        issuers,
        audience=config.server.resource_url,
        algorithms=config.auth.algorithms,
        leeway_s=config.auth.leeway_s,
        claims=config.auth.claims,
    )


def build_runtime(
    config: WritConfig, *, environ: dict[str, str] | None = None, telemetry: Telemetry | None = None
) -> Runtime:
    """Build (but do not start) every component the config describes (`telemetry`: instead of the
    configured exporter's, e.g. in-memory exporters in tests).

    Raises:
        ConfigurationError: any section is invalid.
    """
    base_dir = Path(config.source).parent if config.source else Path.cwd()
    try:
        registry = Registry.from_config(
            config.capabilities_config,
            environ=environ or dict(os.environ),
            base_dir=base_dir,
            reserved=frozenset({STATUS_TOOL}),
        )
        policy_source = policy_provider(
            config.policy,
            config.policy_file,
            base_dir=base_dir,
            vet=lambda policy: vet_tool_names(policy, registry.capabilities()),
        )
        policy = policy_source()
    except (CapabilityError, PolicyError) as exc:
        raise ConfigurationError(f"{config.source or 'config'}: {exc}") from exc
    dev_issuer = dev_issuer_for(config)
    token_verifier(config, dev_issuer, environ=environ)  # a bad issuer is refused before the store opens
    sealing = _sealing(config, base_dir)  # so is a bad key file
    oauth = config.auth.authorization_server
    oauth_settings = settings_for(config) if oauth.enabled else None
    oauth_keys = SigningKeys.load_or_create(oauth.key_file) if oauth.enabled else None
    if oauth_settings is not None and oauth_settings.issuer in {i.issuer for i in config.auth.issuers}:
        raise ConfigurationError(f"auth.issuers: {oauth_settings.issuer} is Writ's own authorization server")
    upstream = (
        upstream_providers(
            config,
            environ=environ or dict(os.environ),
            base_dir=base_dir,
            http=http_factory(config.auth.http_timeout_s),
        )
        if oauth.enabled
        else []
    )
    store = open_store(config)
    # Business time by the database's clock, which replicas of a shared store judge each other by.
    clock = SharedClock(system_clock)
    shared = clock.measure(store.database_time) is not None
    telemetry = telemetry or build_telemetry(config.telemetry)
    telemetry.trace_transactions(store.engine)
    telemetry.observe_waiting(store.waiting_counts)
    authorization_server = None
    own = None
    if oauth_settings is not None and oauth_keys is not None:
        documents = None
        if oauth.client_metadata_documents.enabled:
            section = oauth.client_metadata_documents
            documents = ClientDocuments(
                section,
                store,
                HttpsFetcher(section),
                clock,
                fetch_limit=_document_fetch_limit(section, store),
            )
        users = ConfiguredUsers(oauth.login.users) if isinstance(oauth.login, BuiltinLoginConfig) else None
        authorization_server = WritAuthorizationServer(
            oauth_settings, store, oauth_keys, clock=clock, documents=documents, users=users
        )
        own = own_issuer(oauth_settings.issuer, oauth_keys, store)
    verifier = token_verifier(config, dev_issuer, environ=environ, own=own)
    limiter = RateLimiter(config.rate_limits, store.take_tokens)
    owner, timing = worker_id(), config.workers
    redactor = Redactor.from_file(config.privacy.salt_file)
    # One dispatcher for every path that dispatches: new, confirmed, approved and re-sent calls.
    dispatcher = Dispatcher(
        store=store,
        registry=registry,
        redactor=redactor,
        clock=clock,
        executor_grace_s=timing.executor_grace_s,
        lease_margin_s=timing.lease_margin_s,
        faults=FaultPoints.from_env(environ or os.environ),
    )
    pipeline = CallPipeline(
        store=store,
        registry=registry,
        policy=policy_source,
        redactor=redactor,
        dispatcher=dispatcher,
        clock=clock,
        owner=owner,
        notify_approvals=config.approvals.webhook is not None,
        confirmation_ttl_s=config.confirmations.ttl_s,
        rate_limiter=limiter,
        max_argument_bytes=config.server.max_argument_bytes,
    )
    runtime = Runtime(
        config,
        store,
        registry,
        policy,
        pipeline,
        verifier,
        dev_issuer,
        telemetry,
        sealing=sealing,
        dispatcher=dispatcher,
        policy_source=policy_source,
        clock=clock,
        authorization_server=authorization_server,
        upstream=upstream,
    )
    if timing.enabled:
        recovery = _workers(runtime, owner, redactor)
        runtime.background.append(
            lambda: run_periodically(
                recovery.tick,
                interval_s=timing.interval_s,
                failure="background worker pass failed",
                log=logging.getLogger(Workers.__module__),
            )
        )
    if isinstance(policy_source, WatchedPolicyFile):
        _attach_policy_watch(runtime, policy_source)
    if shared:
        _attach_clock_watch(runtime, clock)
    _attach_approvals(runtime, owner, environ or dict(os.environ))
    _attach_checkpointer(runtime, environ or dict(os.environ))
    _attach_security_events(runtime)
    return runtime


CLOCK_CHECK_S = 30.0
"""How often a replica measures its host clock's offset from the database's again."""


def _attach_clock_watch(runtime: Runtime, clock: SharedClock) -> None:
    """Measure the offset to the database's clock again now and then: a host's clock drifts, and NTP
    steps it."""

    async def measure() -> None:
        await anyio.to_thread.run_sync(lambda: clock.measure(runtime.store.database_time))

    runtime.background.append(
        lambda: run_periodically(
            measure,
            interval_s=CLOCK_CHECK_S,
            failure="measuring the clock's offset from the database's failed",
            log=logging.getLogger(SharedClock.__module__),
        )
    )


def _attach_policy_watch(runtime: Runtime, watched: WatchedPolicyFile) -> None:
    """Look at the policy file every `interval_s` between calls too: a new file is in force, or a bad
    one reported, when it is written, not when the next call happens to ask."""

    async def look() -> None:
        await anyio.to_thread.run_sync(watched)

    runtime.background.append(
        lambda: run_periodically(
            look,
            interval_s=watched.interval_s,
            failure="policy file check failed",
            log=logging.getLogger(WatchedPolicyFile.__module__),
        )
    )


def _document_fetch_limit(
    section: ClientMetadataDocumentsConfig, store: Store
) -> Callable[[str], float | None]:
    def limit(host: str) -> float | None:
        bucket = Bucket(
            f"oauth-document:{host}", per_s=section.fetches_per_minute / 60, burst=section.fetch_burst
        )
        return store.take_tokens([bucket])

    return limit


def _first_trace(runtime: Runtime) -> FirstTrace:
    """Where resumed and reconciled calls find the trace to link to: the log, only when spans go
    somewhere (the lookup reads the call's events, for a link a no-op tracer would drop)."""
    return first_trace_of(runtime.store) if runtime.telemetry.exports_spans else no_first_trace


def _attach_security_events(runtime: Runtime) -> None:
    """Refusals counted on the request path, written as `security.*` events by a background pass."""
    settings = runtime.config.audit.security_events
    if not settings.enabled:
        return
    security = SecurityEvents(
        runtime.store,
        runtime.clock,
        window_s=settings.window_s,
        max_keys=settings.max_keys,
        counted=runtime.telemetry.security_refused,
    )
    runtime.security = security
    runtime.background.append(
        lambda: run_periodically(
            security.tick,
            interval_s=min(runtime.config.workers.interval_s, settings.window_s),
            failure="security events pass failed",
            log=logging.getLogger(SecurityEvents.__module__),
        )
    )


async def _last_security_events(security: SecurityEvents) -> None:
    # What was counted since the last pass is written on the way out, not lost with the process.
    try:
        await security.tick(flush_all=True)
    except StoreError as exc:
        logger.warning("security events counted since the last pass were not recorded: %s", exc)


def own_issuer(issuer: str, keys: SigningKeys, store: OAuthGrants) -> TrustedIssuer:
    """Writ's authorization server as a trusted issuer: its keys from the key file, and each token
    refused once its sign-in is revoked (the gateway, and the CLI's `--token`)."""
    return TrustedIssuer(issuer, StaticKeys(keys.public_keys), revoked=_sign_in_revoked(store))


def _sign_in_revoked(store: OAuthGrants) -> Callable[[Mapping[str, Any]], Awaitable[bool]]:
    """Whether the sign-in (grant family) an access token of Writ's authorization server belongs to
    was revoked: a replayed code, a reused refresh token, RFC 7009, `writ principals revoke`."""

    async def revoked(claims: Mapping[str, Any]) -> bool:
        family = claims.get("sid")
        if not isinstance(family, str):
            return True
        try:
            return await anyio.to_thread.run_sync(store.family_revoked, family)
        except StoreError as exc:  # refused, not guessed: the token is taken again once the store answers
            raise IssuerUnavailable(f"cannot tell whether sign-in {family} was revoked: {exc}") from exc

    return revoked


def _attach_checkpointer(runtime: Runtime, environ: dict[str, str]) -> None:
    """Checkpoints of the log signed outside the database, when configured (on in `writ demo`), and
    sent to their webhook through the outbox when one is configured.

    Raises:
        ConfigurationError: a webhook is configured without its signing secret in the environment.
    """
    settings = runtime.config.audit.checkpoints
    if not settings.enabled:
        return
    checkpointer = Checkpointer(
        log=runtime.store,
        signer=CheckpointSigner.load_or_create(settings.key_file, settings.trusted_keys),
        directory=settings.directory,
        trusted=settings.trusted_keys,
        clock=runtime.clock,
        every_events=settings.every_events,
        every_s=settings.every_s,
        outbox=runtime.store if settings.webhook is not None else None,
    )
    runtime.telemetry.checkpoint_age(checkpointer.age_s)
    if settings.webhook is not None:
        _deliver(runtime, settings.webhook, TOPIC_CHECKPOINT, "audit.checkpoints.webhook", environ)
    runtime.background.append(
        lambda: run_periodically(
            checkpointer.tick,
            interval_s=min(runtime.config.workers.interval_s, settings.every_s),
            failure="checkpoint pass failed",
            log=logging.getLogger(Checkpointer.__module__),
        )
    )


def _sealing(config: WritConfig, base_dir: Path) -> RequestStateSecurity:
    """Confirmation rounds sealed under the configured key file (relative to the config), if any.

    Raises:
        ConfigurationError: the key file cannot be read or holds an unfit key.
    """
    confirmations = config.confirmations
    if confirmations.key_file is None:
        return mcp_rounds.sealing(confirmations.ttl_s)
    path = Path(confirmations.key_file).expanduser()
    return mcp_rounds.sealing(
        confirmations.ttl_s, mcp_rounds.read_keys(path if path.is_absolute() else base_dir / path)
    )


def _attach_approvals(runtime: Runtime, owner: str, environ: dict[str, str]) -> None:
    """Decisions, the worker that runs approved calls and expires approvals, webhook delivery.

    Raises:
        ConfigurationError: a webhook is configured without its signing secret in the environment.
    """
    config = runtime.config.approvals
    clock = runtime.clock
    resumer = Resumer(
        store=runtime.store,
        agenda=runtime.store,
        dispatcher=runtime.dispatcher,
        registry=runtime.registry,
        policy=runtime.policy_source,
        clock=clock,
        owner=owner,
        first_trace=_first_trace(runtime),
    )
    wake = Wake()
    runtime.decisions = Decisions(runtime.store, clock, on_granted=wake)
    # The console records its decisions in its own name, on the same database and pool.
    runtime.console_decisions = Decisions(
        runtime.store.with_producer(CONSOLE), clock, on_granted=wake, expiring=runtime.store
    )
    runtime.background.append(
        lambda: run_periodically(
            resumer.tick,
            interval_s=config.poll_interval_s,
            failure="approval worker pass failed",
            wake=wake,
            log=logging.getLogger(Resumer.__module__),
        )
    )
    if config.webhook is not None:
        _deliver(runtime, config.webhook, TOPIC_APPROVAL_REQUIRED, "approvals.webhook", environ)


def _deliver(
    runtime: Runtime, webhook: WebhookConfig, topic: str, section: str, environ: dict[str, str]
) -> None:
    """A worker POSTing the outbox's messages of `topic` to `webhook`, signed with its secret.

    Raises:
        ConfigurationError: the signing secret is not in the environment.
    """
    secret = environ.get(webhook.secret_env)
    if not secret:
        raise ConfigurationError(f"{section}: set the signing secret in ${webhook.secret_env}")
    config = runtime.config.approvals
    notifier = Notifier(
        store=runtime.store,
        webhook=webhook,
        secret=secret.encode(),
        clock=runtime.clock,
        owner=worker_id(),
        console_url=config.console_url or f"{runtime.config.server.base_url}/console",
        topics=(topic,),
    )
    interval_s = config.poll_interval_s

    async def deliver() -> None:
        async with notifier.client() as http:
            await run_periodically(
                lambda: notifier.tick(http),
                interval_s=interval_s,
                failure=f"outbox delivery pass failed ({topic})",
                log=logging.getLogger(Notifier.__module__),
            )

    runtime.background.append(deliver)


def _workers(runtime: Runtime, owner: str, redactor: Redactor) -> Workers:
    timing = runtime.config.workers
    clock = runtime.clock
    reconciler = Reconciler(
        store=runtime.store,
        registry=runtime.registry,
        dispatcher=runtime.dispatcher,
        redactor=redactor,
        owner=owner,
        clock=clock,
        policy=ReconcilePolicy(
            timing.reconcile_max_attempts,
            timing.reconcile_backoff_s,
            timing.reconcile_backoff_max_s,
            tuple(timing.reconcile_recheck_after),
        ),
        first_trace=_first_trace(runtime),
        on_outcome=runtime.telemetry.reconciled,
    )
    return Workers(
        store=runtime.store, agenda=runtime.store, reconciler=reconciler, clock=clock, pruning=runtime.store
    )


def parked_calls(runtime: Runtime) -> Parked | None:
    """Where upstream calls wait on a 2026-07-28 client's input-required rounds (run by the runtime's
    workers), when an upstream MCP server is configured."""
    if not runtime.registry.upstreams():
        return None
    parked = Parked(runtime.config.confirmations.ttl_s)
    runtime.background.append(parked.serve)
    return parked


def build_app(runtime: Runtime) -> Starlette:
    """The HTTP application: /mcp, OAuth metadata, health, API; one lifespan for all of it."""
    config = runtime.config
    server_config = config.server

    def current_principal() -> Principal | None:
        token = get_access_token()
        return runtime.principal_from_claims(token.claims or {}) if token is not None else None

    mcp_server = build_mcp_server(
        runtime.pipeline,
        Catalogue(runtime.registry, runtime.policy_source),
        runtime.store,
        current_principal,
        clock=runtime.clock,
        telemetry=runtime.telemetry,
        sealing=runtime.sealing,
        registry=runtime.registry,
        security=runtime.security,
        parked=parked_calls(runtime),
    )
    session_manager = StreamableHTTPSessionManager(
        app=mcp_server,
        json_response=(
            server_config.json_response
            if server_config.json_response is not None
            else not runtime.registry.upstreams()
        ),
        stateless=server_config.stateless_http,
        security_settings=_transport_security(config),
    )
    resource_url = AnyHttpUrl(server_config.resource_url)
    metadata_url = str(build_resource_metadata_url(resource_url))
    metadata_routes = _resource_metadata_routes(runtime, resource_url)

    async def healthz(request: Request) -> Response:
        return JSONResponse({"ok": True})

    async def readyz(request: Request) -> Response:
        try:
            ready = await anyio.to_thread.run_sync(runtime.store.is_migrated)
        except StoreError as exc:  # readiness reports the failure instead of raising it
            logger.warning("readiness check failed: %s", exc)
            ready = False
        return JSONResponse({"ready": ready}, status_code=200 if ready else 503)

    async def dev_jwks(request: Request) -> Response:
        assert runtime.dev_issuer is not None
        return JSONResponse(runtime.dev_issuer.jwks())

    routes: list[BaseRoute] = [
        Route(
            "/mcp",
            endpoint=RequireAuthMiddleware(
                StreamableHTTPASGIApp(session_manager), config.auth.required_scopes, AnyHttpUrl(metadata_url)
            ),
        ),
        *metadata_routes,
        # The root form of RFC 9728 metadata, for clients that look there first.
        Route(
            "/.well-known/oauth-protected-resource", metadata_routes[0].endpoint, methods=["GET", "OPTIONS"]
        ),
        Route("/healthz", healthz),
        Route("/readyz", readyz),
        *api_routes(
            runtime.store, _principal_of_user(runtime), metadata_url, runtime.decisions, clock=runtime.clock
        ),
        *principal_routes(runtime.store, _principal_of_user(runtime), metadata_url, clock=runtime.clock),
        *run_routes(runtime.store, _principal_of_user(runtime), metadata_url, clock=runtime.clock),
        *retry_routes(
            runtime.store, runtime.registry, runtime.pipeline, _principal_of_user(runtime), metadata_url
        ),
    ]
    if runtime.console_decisions is not None:
        routes.extend(
            console_routes(
                store=runtime.store.with_producer(CONSOLE),
                sessions=runtime.store,
                decisions=runtime.console_decisions,
                verify=_sign_in_of_token(runtime),
                security=runtime.security,
                clock=runtime.clock,
                secure_cookies=server_config.base_url.startswith("https://"),
                public_url=server_config.public_url,
                in_force=InForce(runtime.registry.in_force, lambda: runtime.policy_source().version),
                clients=(
                    (runtime.store.with_producer(CONSOLE), config.auth.authorization_server.liveness())
                    if runtime.authorization_server is not None
                    else None
                ),
                runs=runtime.store.with_producer(CONSOLE),
                retries=functools.partial(
                    retry_call, store=runtime.store, registry=runtime.registry, pipeline=runtime.pipeline
                ),
            )
        )
    if runtime.dev_issuer is not None:
        routes.append(Route("/dev-issuer/jwks.json", dev_jwks))
    if runtime.authorization_server is not None:
        routes.extend(_authorization_routes(runtime, runtime.authorization_server))
        routes.extend(
            client_routes(
                runtime.store,
                _principal_of_user(runtime),
                metadata_url,
                clock=runtime.clock,
                liveness=config.auth.authorization_server.liveness(),
            )
        )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with runtime.running(), session_manager.run():
            yield  # `writ serve` says it is ready once uvicorn listens (gateway/serve.py)

    return Starlette(
        routes=routes,
        middleware=[
            # One layer for every step of the HTTP edge (gateway/http/edge.py says which, in order).
            Middleware(
                Edge,
                telemetry=runtime.telemetry,
                security=runtime.security,
                backend=bearer_backend(runtime.verifier, runtime.telemetry, runtime.security),
                on_error=refused_token(metadata_url),
                body_timeout_s=server_config.body_timeout_s,
                known_cause=known_cause,
            ),
        ],
        lifespan=lifespan,
    )


def _resource_metadata_routes(runtime: Runtime, resource_url: AnyHttpUrl) -> list[Route]:
    """RFC 9728 metadata naming the authorization servers that answer: Writ's own when it runs, and
    the configured issuers (never the dev issuer, which has no endpoints: its tokens are pasted)."""
    config = runtime.config
    servers = [issuer.issuer for issuer in config.auth.issuers]
    if runtime.authorization_server is not None:
        servers.insert(0, runtime.authorization_server.settings.issuer)
    scopes = config.auth.required_scopes or None
    if servers:
        return create_protected_resource_routes(
            resource_url=resource_url,
            authorization_servers=[AnyHttpUrl(server) for server in servers],
            scopes_supported=scopes,
            resource_name="Writ",
        )
    # No server to name (tokens come from `writ token` only): authorization_servers is left out, as
    # RFC 9728 allows, rather than naming one that does not answer.
    document: dict[str, Any] = {
        "resource": str(resource_url),
        "bearer_methods_supported": ["header"],
        "resource_name": "Writ",
    }
    if scopes:
        document["scopes_supported"] = scopes

    async def metadata(request: Request) -> Response:
        return JSONResponse(document, headers={"Cache-Control": "public, max-age=3600"})

    path = urlsplit(str(build_resource_metadata_url(resource_url))).path
    return [Route(path, cors_middleware(metadata, ["GET", "OPTIONS"]), methods=["GET", "OPTIONS"])]


def _authorization_routes(runtime: Runtime, server: WritAuthorizationServer) -> list[BaseRoute]:
    """The authorization server's face, with its login step (the built-in one: `writ demo`)."""
    section = runtime.config.auth.authorization_server
    assert section.login is not None  # the config refuses an enabled server without one
    server.security = runtime.security
    store = runtime.store
    secure = runtime.config.server.base_url.startswith("https://")
    cookies = SigninCookies(
        server.keys,
        server.settings.issuer,
        ttl_s=section.login_ttl_s,
        secure=secure,
    )
    pages = Pages()

    def registration_limit(address: str) -> float | None:
        bucket = Bucket(
            f"oauth-register:{address}",
            per_s=section.registrations_per_minute / 60,
            burst=section.registration_burst,
        )
        return store.take_tokens([bucket])

    login: LoginStep
    if isinstance(section.login, OidcLoginConfig):
        attempts = AttemptCookies(
            server.keys, server.settings.issuer, ttl_s=section.login_ttl_s, secure=secure
        )
        login = OidcLogin(runtime.upstream, pages, cookies, attempts, runtime.security)
    else:
        login = BuiltinLogin(section.login.users, pages, cookies)
    return AuthorizationRoutes(server, login, pages, cookies, registration_limit, store).routes()


def _sign_in_of_token(runtime: Runtime) -> Callable[[str], Awaitable[SignIn | None]]:
    # A token pasted at the console's login: verified exactly as /mcp verifies it, and a refusal says
    # why (TokenRejected), for the console to note it as /mcp does. Its session lasts no longer than
    # the token, and ends with its sign-in when the token is one of Writ's authorization server.
    own_issuer = runtime.authorization_server.settings.issuer if runtime.authorization_server else None

    async def sign_in_of(token: str) -> SignIn | None:
        try:
            access = await runtime.verifier.verify_token(token, explain=True)
        except TokenRejected as exc:
            runtime.telemetry.authentication_failed(exc.kind)  # `writ.auth.failures`, as at /mcp
            raise
        if access is None:
            return None
        claims = access.claims or {}
        family = claims.get("sid") if own_issuer is not None and claims.get("iss") == own_issuer else None
        # Every accepted token has an `exp` (JwtVerifier requires it, of an introspected token too);
        # without one no session is opened (the console says the token has expired).
        expires = claims.get("exp")
        if not isinstance(expires, int | float):
            expires = access.expires_at or 0
        return SignIn(
            principal=runtime.principal_from_claims(claims),
            expires_at=datetime.fromtimestamp(float(expires), UTC),
            grant_family=family if isinstance(family, str) else None,
        )

    return sign_in_of


def _principal_of_user(runtime: Runtime) -> Any:
    def principal_of(user: AuthenticatedUser) -> Principal:
        return runtime.principal_from_claims(user.access_token.claims or {})

    return principal_of


def _transport_security(config: WritConfig) -> TransportSecuritySettings | None:
    server = config.server
    if server.allowed_hosts is not None:
        origins = server.allowed_origins
        if origins is None:
            public = urlsplit(server.base_url)
            origins = [f"{public.scheme}://{public.netloc}"] if server.public_url else []
        return TransportSecuritySettings(
            enable_dns_rebinding_protection=True, allowed_hosts=server.allowed_hosts, allowed_origins=origins
        )
    if server.host in ("127.0.0.1", "localhost", "::1"):
        return TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
            allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
        )
    return TransportSecuritySettings(enable_dns_rebinding_protection=False)
