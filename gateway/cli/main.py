"""The `writ` command line (DESIGN §7)."""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import anyio
import typer

from gateway.cli.authority import (
    AsOption,
    Authority,
    BreakGlassOption,
    ByOption,
    TokenOption,
    authority,
    check_standing,
)
from gateway.cli.clients import oauth_app
from gateway.cli.clock import CLOCK
from gateway.cli.identity import policy_app, principals_app
from gateway.cli.refusals import exit_refused
from gateway.cli.retries import calls_retry
from gateway.cli.runs import runs_app
from gateway.config import WritConfig, find_config_file, load_config, no_config_file
from gateway.display import visible_line
from gateway.errors import GatewayError, Refused
from store.commands import ResolveManually
from store.limits import NAME_CHARS, SUBJECT_CHARS, TENANT_CHARS, refusal, text_unfit
from store.model import StoreError

if TYPE_CHECKING:
    from gateway.audit.checkpoints import Checkpoint
    from store.model import AuditReport
    from store.ports import Standing

logger = logging.getLogger(__name__)

app = typer.Typer(help="Writ: a guarded MCP tool gateway.", no_args_is_help=True, add_completion=False)
store_app = typer.Typer(help="Manage the event store.", no_args_is_help=True)
audit_app = typer.Typer(help="Audit the tamper-evident effect log.", no_args_is_help=True)
calls_app = typer.Typer(help="Inspect tool calls.", no_args_is_help=True)
approvals_app = typer.Typer(help="Inspect and decide approvals.", no_args_is_help=True)
config_app = typer.Typer(help="The configuration file.", no_args_is_help=True)
app.add_typer(config_app, name="config")
app.add_typer(store_app, name="store")
app.add_typer(audit_app, name="audit")
app.add_typer(calls_app, name="calls")
app.add_typer(approvals_app, name="approvals")
app.add_typer(policy_app, name="policy")
app.add_typer(principals_app, name="principals")
app.add_typer(oauth_app, name="oauth")
app.add_typer(runs_app, name="runs")

ConfigOption = Annotated[
    str | None,
    typer.Option(
        "--config",
        "-c",
        help="Config file (default: $WRIT_CONFIG, ./writ.yaml, ./.writ/demo.yaml, built-in).",
    ),
]


def _config(path: str | None) -> WritConfig:
    return load_config(find_config_file(path))


def _fail(message: str, code: int = 2) -> None:
    typer.echo(f"writ: {message}", err=True)
    raise typer.Exit(code)


@app.command()
def serve(
    config: ConfigOption = None,
    host: Annotated[str | None, typer.Option(help="Bind address (overrides the config).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (overrides the config).")] = None,
) -> None:
    """Run the gateway over streamable HTTP at /mcp."""
    from gateway.serve import serve_http

    path = find_config_file(config)
    if path is None:  # else a typo in a file's name would serve nothing, and say nothing of it
        logger.warning(no_config_file())
    cfg = load_config(path)
    updates = {k: v for k, v in {"host": host, "port": port}.items() if v is not None}
    if updates:
        cfg = cfg.model_copy(update={"server": cfg.server.model_copy(update=updates)})
    serve_http(cfg)


@app.command()
def stdio(config: ConfigOption = None) -> None:
    """Serve MCP over stdin/stdout for one local client; the caller's token comes from $WRIT_TOKEN."""
    from gateway.stdio import serve_stdio

    serve_stdio(_config(config))


@app.command()
def demo(
    port: Annotated[int, typer.Option(help="Gateway port.")] = 8080,
    backend_port: Annotated[int, typer.Option(help="Port of the acme-payments demo backend.")] = 8081,
) -> None:
    """Run Writ with a demo payments backend, all state under ./.writ/."""
    from demo.run import run_demo

    run_demo(port=port, backend_port=backend_port)


@app.command()
def token(
    sub: Annotated[str, typer.Option("--sub", help="Subject (who the token speaks for).")],
    roles: Annotated[str, typer.Option(help="Comma-separated roles, e.g. agent,approver.")] = "",
    tenant: Annotated[str, typer.Option(help="Tenant.")] = "default",
    scopes: Annotated[str, typer.Option(help="Comma-separated OAuth scopes.")] = "",
    ttl: Annotated[int | None, typer.Option(min=1, help="Lifetime in seconds (default from config).")] = None,
    config: ConfigOption = None,
) -> None:
    """Mint a bearer token from the built-in development issuer; the token is the last line."""
    from gateway.opening import dev_issuer_for

    # A token the gateway would refuse (no subject) or that names a role " approver" is never wanted.
    sub = sub.strip()
    if not sub:
        _fail("--sub must name someone (it is the token's subject)")
    role_names = [r.strip() for r in roles.split(",") if r.strip()]
    scope_names = [s.strip() for s in scopes.split(",") if s.strip()]
    # The gateway refuses a token naming what its store cannot hold: say so now, not at every call.
    named = [("--sub", sub, SUBJECT_CHARS), ("--tenant", tenant, TENANT_CHARS)]
    named += [("a name in --roles", r, NAME_CHARS) for r in role_names]
    named += [("a name in --scopes", s, NAME_CHARS) for s in scope_names]
    for message in filter(None, (refusal(*n) for n in named)):
        _fail(message)
    cfg = _config(config)
    issuer = dev_issuer_for(cfg)
    if issuer is None:
        _fail(
            f"the development issuer is off in {cfg.source or 'the default config'}, so `writ token` "
            "mints nothing; for development only, turn it on with `auth: {dev_issuer: {enabled: true}}` "
            "(`writ demo` does), or get a token from one of your auth.issuers"
        )
        return
    minted = issuer.mint(
        subject=sub,
        audience=cfg.server.resource_url,
        tenant=tenant,
        roles=role_names,
        scopes=scope_names,
        ttl_s=ttl or cfg.auth.dev_issuer.token_ttl_s,
    )
    typer.echo(
        f"# token for sub={sub} tenant={tenant} roles={','.join(role_names) or '-'} "
        f"aud={cfg.server.resource_url}",
        err=True,
    )
    typer.echo(minted)


@config_app.command("schema")
def config_schema() -> None:
    """Print the configuration file's JSON schema (deploy/writ.schema.json is this, for editors)."""
    from gateway.config import json_schema

    typer.echo(json.dumps(json_schema(), indent=2))


@store_app.command("migrate")
def store_migrate(config: ConfigOption = None) -> None:
    """Create or upgrade the store's schema."""
    from store.store import Store

    cfg = _config(config)
    store = Store.open(
        cfg.store.url,
        durable=cfg.store.durable,
        idle_transaction_timeout_s=cfg.store.idle_transaction_timeout_s,
    )
    try:
        store.migrate()
    finally:
        store.close()
    typer.echo("store migrated")


CheckpointsOption = Annotated[
    list[str] | None,
    typer.Option(
        "--checkpoints",
        help="A checkpoint file or directory (*.jws); repeatable. Default: audit.checkpoints.directory.",
    ),
]


ArchiveOption = Annotated[
    Path | None,
    typer.Option(
        "--archive",
        help="The directory `writ store archive` moved the log's oldest events to: read first.",
    ),
]


def _signed_checkpoints(config: str | None, given: list[str] | None) -> list[Checkpoint]:
    """The checkpoints at `given` paths, else in the configured directory, each verified against the
    trusted keys.

    Raises:
        CheckpointUnverifiable: one cannot be read or verified.
    """
    from gateway.audit.checkpoints import read_all, trusted_keys

    settings = _config(config).audit.checkpoints
    paths = given or ([settings.directory] if Path(settings.directory).is_dir() else [])
    return read_all(paths, trusted_keys(settings.trusted_keys)) if paths else []


@store_app.command("rebuild")
def store_rebuild(config: ConfigOption = None, archive: ArchiveOption = None) -> None:
    """Rebuild every projection (calls, approvals, runs, effect ledger) from the event log alone."""
    try:
        with _store(config) as store:
            count = store.rebuild(archive)
    except StoreError as exc:
        _fail(str(exc))
        return
    typer.echo(f"rebuilt projections from {count} events")


@store_app.command("archive")
def store_archive(
    to: Annotated[Path, typer.Option("--to", help="Directory of the archive files and their manifest.")],
    older_than_days: Annotated[
        float, typer.Option("--older-than-days", min=0, help="Only events older than this many days.")
    ] = 30,
    config: ConfigOption = None,
    checkpoints: CheckpointsOption = None,
) -> None:
    """Move the log's oldest events, up to the newest signed checkpoint, older than the given age and
    with every call they name settled, out of the database into gzip JSON-lines files under --to."""
    from datetime import timedelta

    from gateway.audit.checkpoints import CheckpointUnverifiable

    try:
        found = _signed_checkpoints(config, checkpoints)
    except CheckpointUnverifiable as exc:
        _fail(f"cannot archive: {exc}")
        return
    if not found:
        _fail("no signed checkpoint: only events one vouches for are archived (`writ audit checkpoint`)")
        return
    upto: dict[str, int] = {}  # each partition up to the newest seq a checkpoint vouches for there
    for checkpoint in found:
        for claim in checkpoint.anchor.claims():
            upto[claim.partition] = max(upto.get(claim.partition, 0), claim.seq)
    moved = []
    try:
        with _store(config) as store:
            before = CLOCK() - timedelta(days=older_than_days)  # by the database's clock, once opened
            for segment in store.archive_all(to, upto_seq=upto, before=before):
                moved.append(segment)
                where = f"partition {segment.partition!r} " if segment.partition else ""
                typer.echo(
                    f"archived {where}seqs {segment.first_seq}-{segment.last_seq} to {to / segment.file}"
                )
    except StoreError as exc:
        _fail(f"cannot archive: {exc}")
        return
    if moved:
        # The database's log now begins after the archive: verify and rebuild need the files too.
        typer.echo(
            f"from now on: `writ audit verify --archive {to}` (and `writ store rebuild --archive {to}`)"
        )
    if not moved:
        when = f"{before:%Y-%m-%dT%H:%M:%SZ}"
        if set(upto) <= {""}:
            within = f"up to seq {upto.get('', 0)}"
        else:
            within = f"in {len(upto)} partitions up to the seqs the checkpoints vouch for"
        typer.echo(f"nothing to archive ({within}, older than {when}, calls settled)")


@audit_app.command("verify")
def audit_verify(
    config: ConfigOption = None, checkpoints: CheckpointsOption = None, archive: ArchiveOption = None
) -> None:
    """Check the hash chain and the signed checkpoints, replay the log against the projections the
    gateway acts on, and check the event grammar; exit 1 naming the first bad seq or row on any finding."""
    from gateway.audit.checkpoints import CheckpointUnverifiable

    try:
        found = _signed_checkpoints(config, checkpoints)
    except CheckpointUnverifiable as exc:
        typer.echo(f"UNVERIFIABLE: {exc}", err=True)
        raise typer.Exit(1) from None
    from store.model import ScratchUnavailable

    try:
        with _store(config) as store:
            report = store.verify([c.anchor for c in found], archive)
    except ScratchUnavailable as exc:
        _fail(f"cannot verify: {exc}")
        return
    if not report.chain_ok:
        finding = f"first bad seq {report.first_bad_seq} ({report.problem}): {report.detail or ''}"
        typer.echo(f"TAMPERED: {finding}".rstrip(": "), err=True)
        typer.echo("projections: not compared (the log itself is altered: a replay of it proves nothing)")
        typer.echo("grammar: not checked (the log itself is altered)")
        raise typer.Exit(1)
    verdict = "ok" if report.ok else "chain"
    typer.echo(f"{verdict}: {report.events_checked} events, hash chain intact")
    if found:
        newest = max(found, key=lambda c: (c.anchor.seq, c.at))
        plural = "" if len(found) == 1 else "s"
        if report.anchored_events == report.anchored_seq:  # partition "" alone, or one partition
            anchored = f"anchored up to seq {report.anchored_seq}"
        else:
            anchored = f"anchored {report.anchored_events} events across the log's partitions"
        typer.echo(
            f"{anchored} by {len(found)} checkpoint{plural} (newest {newest.at}, kid {newest.kid}); "
            f"{report.unanchored_events} later events not yet anchored"
        )
    else:
        typer.echo(
            "no checkpoints: nothing vouches for the log against someone who can rewrite the "
            "database (see `writ audit checkpoint`)"
        )
    typer.echo(f"projections: {_projections_line(report)}")
    typer.echo(f"grammar: {_grammar_line(report)}")
    if not report.ok:
        typer.echo("TAMPERED: what the gateway acts on is not what the log says (see above)", err=True)
        raise typer.Exit(1)


def _projections_line(report: AuditReport) -> str:
    difference = report.projection_difference
    if difference is not None:
        others = [t for t in report.differing_tables if t != difference.table]
        also = f"; also differ: {', '.join(others)}" if others else ""
        return f"first difference in {difference.describe()}{also}"
    if not report.projections_compared:
        return "not compared (the replay stopped at the grammar violation below)"
    return "match (every projection the gateway acts on equals a replay of the log)"


def _grammar_line(report: AuditReport) -> str:
    violation = report.grammar_violation
    if violation is None:
        return "ok (every call's events follow the lifecycle)"
    return f"first violation at {violation.describe()}"


@audit_app.command("checkpoint")
def audit_checkpoint(
    config: ConfigOption = None,
    new_key: Annotated[
        bool, typer.Option("--new-key", help="Rotate: make a new signing key (the old one stays trusted).")
    ] = False,
) -> None:
    """Sign the log's head with a key kept outside the database and append it to the checkpoints."""
    from gateway.audit.checkpointer import announce
    from gateway.audit.checkpoints import CheckpointSigner, trusted_keys, write_checkpoint

    settings = _config(config).audit.checkpoints
    signer = CheckpointSigner.load_or_create(settings.key_file, settings.trusted_keys)
    if new_key:
        signer = signer.rotate()
    with _store(config) as store:
        made, path = write_checkpoint(
            store, signer, settings.directory, trusted_keys(settings.trusted_keys), CLOCK()
        )
        if settings.webhook is not None:  # the gateway's outbox worker sends it
            announce(store, made, CLOCK())
    others = f" and the heads of {len(made.anchor.heads)} other partitions" if made.anchor.heads else ""
    pages = f" in {len(made.lines)} signed lines (pages)" if len(made.lines) > 1 else ""
    typer.echo(f"checkpoint at seq {made.anchor.seq}{others} (kid {made.kid}) appended to {path}{pages}")
    if settings.webhook is not None:
        typer.echo(f"queued for {settings.webhook.url}")


class ExportFormat(enum.StrEnum):
    JSONL = "jsonl"
    OCSF = "ocsf"


FOLLOW_INTERVAL_S = 1.0
"""How often `writ audit export --follow` asks the store for what committed since."""


@audit_app.command("export")
def audit_export(
    config: ConfigOption = None,
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's events.")] = None,
    since: Annotated[
        str | None, typer.Option(help="Events at or after this ISO 8601 time with offset (…Z).")
    ] = None,
    until: Annotated[str | None, typer.Option(help="Events before this ISO 8601 time with offset.")] = None,
    type_: Annotated[
        list[str] | None,
        typer.Option("--type", help="An event type, or a prefix such as tool_call.*; repeatable."),
    ] = None,
    principal: Annotated[
        str | None, typer.Option(help="Only the events of this subject's runs and calls.")
    ] = None,
    capability: Annotated[
        str | None, typer.Option(help="Only events recorded under this capability id.")
    ] = None,
    after_seq: Annotated[int, typer.Option(min=0, help="Only events after this seq (a cursor).")] = 0,
    format_: Annotated[
        ExportFormat, typer.Option("--format", help="jsonl: Writ's envelopes; ocsf: OCSF events.")
    ] = ExportFormat.JSONL,
    follow: Annotated[
        bool, typer.Option("--follow", help="Keep writing events as they commit, until Ctrl-C or SIGTERM.")
    ] = False,
) -> None:
    """Write the log's events as one JSON object per line, in seq order (filtered, after a cursor)."""
    from gateway.audit.exporting import (
        event_filter,
        follow_until_signalled,
        json_line,
        ocsf_line,
        write_events,
    )

    try:
        given = event_filter(
            tenant=tenant,
            since=since,
            until=until,
            types=type_ or (),
            principal=principal,
            capability=capability,
        )
    except Refused as exc:
        _fail(str(exc))
        return
    line = ocsf_line if format_ is ExportFormat.OCSF else json_line
    with _store(config) as store:
        if follow:
            follow_until_signalled(store, given, after_seq, sys.stdout, interval=FOLLOW_INTERVAL_S, line=line)
        else:
            write_events(store, given, after_seq, sys.stdout, line)


@calls_app.command("show")
def calls_show(tool_call_id: str, config: ConfigOption = None) -> None:
    """Show one call's state and its events."""
    from gateway.calls.retries import retry_links
    from gateway.mcp.results import recorded_decision, status_document, unknown_detail

    with _store(config) as store:
        call = store.get_call(tool_call_id)
        if call is None:
            _fail(f"no tool call {tool_call_id!r}", code=1)
            return
        events = store.events(tool_call_id=tool_call_id)
    detail = unknown_detail(events)
    body = status_document(call, include_result=True, decision=recorded_decision(events), detail=detail) | {
        "tenant": call.tenant,
        "subject": call.subject,
        "runId": call.run_id,
        "idempotencyKey": call.idempotency_key,
        # What the backend got (scoped to the principal), to find the call's record there; null unsent.
        "backendKey": call.sent_key if call.attempts else None,
        "arguments": dict(call.arguments),
        "events": [{"seq": e.seq, "type": e.type, "at": e.occurred_at} for e in events],
        **retry_links(events),
    }
    typer.echo(json.dumps(body, indent=2, default=str))


@calls_app.command("list")
def calls_list(
    unresolved: Annotated[
        bool,
        typer.Option(
            "--unresolved", help="Only calls whose outcome is unknown (pending or escalated) or contradicted."
        ),
    ] = False,
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's calls.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many, newest first.")] = 100,
    config: ConfigOption = None,
) -> None:
    """List calls, newest first; --unresolved shows what reconciliation or a human must settle."""
    with _store(config) as store:
        calls = store.list_calls(tenant=tenant, unresolved=unresolved, limit=limit)
    if not calls:
        typer.echo("no calls")
    for c in calls:
        waiting = "  ESCALATED: needs `writ calls resolve`" if c.escalated else ""
        if c.contradicted:
            waiting = "  CONTRADICTED: later evidence disagrees; check, then `writ calls resolve`"
        typer.echo(
            f"{c.tool_call_id}  {c.status:<16} verification={c.verification_status:<17} "
            f"tenant={c.tenant} {visible_line(c.summary)}{waiting}"
        )


calls_app.command("retry")(calls_retry)


@calls_app.command("resolve")
def calls_resolve(
    tool_call_id: str,
    outcome: Annotated[str, typer.Option(help="What really happened: succeeded or failed.")],
    evidence: Annotated[str, typer.Option(help="How you know (a statement line, a ticket, a call).")],
    token: TokenOption = None,
    break_glass: BreakGlassOption = False,
    reason: Annotated[
        str | None, typer.Option("--reason", "-r", help="With --break-glass: why you act without a token.")
    ] = None,
    by: ByOption = None,
    config: ConfigOption = None,
) -> None:
    """Settle a call whose outcome is unknown, with your evidence; recorded with who decided it."""

    from gateway.calls.resolutions import ResolutionInput, resolve_call
    from store.model import NotFound, StaleLease, StoreError

    if outcome not in ("succeeded", "failed"):
        _fail("--outcome must be succeeded or failed")
        return
    if (why := text_unfit(evidence)) is not None:
        _fail(f"--evidence {why}")
    cfg = _config(config)
    who = _authority(cfg, token=token, break_glass=break_glass, reason=reason, impersonated=by, flag="--by")
    with _store(config) as store:
        _standing(store, who)
        try:
            if who.principal is not None:
                resolution = ResolutionInput(
                    tool_call_id=tool_call_id,
                    succeeded=outcome == "succeeded",
                    evidence=evidence,
                    resolved_by=who.name,
                    roles=who.principal.roles,
                    tenant=who.principal.tenant,
                )
                call = anyio.run(resolve_call, store, resolution, CLOCK())
            else:
                call = store.resolve_manually(
                    ResolveManually(
                        tool_call_id,
                        succeeded=outcome == "succeeded",
                        evidence=evidence,
                        by=who.name,
                        now=CLOCK(),
                        break_glass=True,
                        reason=who.reason,
                    )
                )
        except Refused as exc:
            exit_refused(exc)
        except NotFound:
            _fail(f"no tool call {tool_call_id!r}", code=1)
            return
        except (StaleLease, StoreError) as exc:
            _fail(str(exc), code=1)
            return
    mark = " (break-glass)" if who.break_glass else ""
    if call.contradicted:
        typer.echo(
            f"{call.tool_call_id} stays {call.status}: contradicted by {who.name}{mark}, "
            "recorded and escalated"
        )
        return
    typer.echo(
        f"{call.tool_call_id} is {call.status} ({call.verification_status}), resolved by {who.name}{mark}"
    )


@approvals_app.command("list")
def approvals_list(
    status: Annotated[str | None, typer.Option(help="Filter: awaiting_approval, approved, ...")] = None,
    config: ConfigOption = None,
) -> None:
    """List approvals, oldest first (the order they wait in), each with the effect it would have."""
    with _store(config) as store:
        approvals = store.list_approvals(status=status)
        calls = {a.tool_call_id: store.get_call(a.tool_call_id) for a in approvals}
    if not approvals:
        typer.echo("no approvals")
    for a in approvals:
        call = calls[a.tool_call_id]
        effect = visible_line(call.summary) if call else ""
        typer.echo(
            f"{a.approval_id}  {a.status:<18} call={a.tool_call_id} requester={visible_line(a.requester)} "
            f"role={a.approver_role} expires={a.expires_at.isoformat()}  {effect}"
        )


@approvals_app.command("show")
def approvals_show(approval_id: str, config: ConfigOption = None) -> None:
    """Show one approval, the exact action it is bound to, and the policy's decision that asked for it."""
    from dataclasses import asdict

    from gateway.mcp.results import recorded_decision

    with _store(config) as store:
        approval = store.get_approval(approval_id)
        if approval is None:
            _fail(f"no approval {approval_id!r}", code=1)
            return
        call = store.get_call(approval.tool_call_id)
        # As recorded with the request: the rule, its reason and its message for the approver.
        decision = recorded_decision(store.events(tool_call_id=approval.tool_call_id))
    body = asdict(approval) | {
        "effect": call.summary if call else None,
        "arguments": dict(call.arguments) if call else None,
        "decision": decision,
    }
    typer.echo(json.dumps(body, indent=2, default=str))


ReasonOption = Annotated[
    str | None, typer.Option("--reason", "-r", help="Why (recorded; required with --break-glass).")
]


def _decision_command(approve: bool, doc: str) -> Callable[..., None]:
    """`approve` and `reject` take the same options and differ only in the decision they record."""

    def command(
        approval_id: str,
        reason: ReasonOption = None,
        token: TokenOption = None,
        break_glass: BreakGlassOption = False,
        as_: AsOption = None,
        config: ConfigOption = None,
    ) -> None:
        _decide(
            approval_id, approve, token=token, break_glass=break_glass, reason=reason, as_=as_, config=config
        )

    command.__doc__ = doc
    return command


approvals_app.command("approve")(
    _decision_command(
        True, "Approve a pending call; a running gateway then re-authorizes and executes it once."
    )
)
approvals_app.command("reject")(_decision_command(False, "Reject a pending call; it will never run."))


def _decide(
    approval_id: str,
    approve: bool,
    *,
    token: str | None,
    break_glass: bool,
    reason: str | None,
    as_: str | None,
    config: str | None,
) -> None:
    # With a token: the API's checks (role, tenant, separation of duties, standing). Break-glass: the
    # operator holds the store itself, so no role or tenant is checked; the self-approval rule is.
    from dataclasses import asdict

    from gateway.calls.approvals import DecisionInput, Decisions
    from store.store import PRODUCER

    cfg = _config(config)
    who = _authority(cfg, token=token, break_glass=break_glass, reason=reason, impersonated=as_)
    principal = who.principal
    with _store(config) as store:
        _standing(store, who)
        try:
            # An expiry the decision runs into is recorded in the gateway's name, as the worker does.
            expiring = store.with_producer(PRODUCER)
            approval = Decisions(store, CLOCK, expiring=expiring).decide_now(
                DecisionInput(
                    approval_id,
                    approve,
                    who.name,
                    reason=reason,
                    roles=principal.roles if principal else None,
                    tenant=principal.tenant if principal else None,
                    break_glass=who.break_glass,
                )
            )
        except Refused as exc:
            exit_refused(exc)
    typer.echo(json.dumps(asdict(approval) | {"break_glass": who.break_glass}, indent=2, default=str))


def _authority(cfg: WritConfig, **given: Any) -> Authority:
    try:
        return authority(cfg, **given)
    except Refused as exc:
        exit_refused(exc)


def _standing(store: Standing, who: Authority) -> None:
    try:
        check_standing(store, who)
    except Refused as exc:
        exit_refused(exc)


@approvals_app.command("outbox")
def approvals_outbox(
    status: Annotated[str | None, typer.Option(help="Filter: pending, delivered, dead.")] = None,
    config: ConfigOption = None,
) -> None:
    """Notifications of pending approvals (and checkpoints, with a checkpoint webhook) and how their
    webhook delivery stands (failures included)."""
    with _store(config) as store:
        messages = store.outbox_messages(status=status)
    if not messages:
        typer.echo("no messages")
    for m in messages:
        what = f"approval={m.approval_id}" if m.approval_id else f"topic={m.topic}"
        typer.echo(
            f"{m.message_id}  {m.status:<9} attempts={m.attempts} {what} "
            f"next={m.next_attempt_at.isoformat()} error={m.last_error or '-'}"
        )


class _store:
    """Open the configured store for one command (migrated or refused), close it after."""

    def __init__(self, config: str | None) -> None:
        self._config = config

    def __enter__(self):  # type: ignore[no-untyped-def]
        from gateway.cli.stores import opened_store

        self._store = opened_store(_config(self._config))
        return self._store

    def __exit__(self, *exc: object) -> None:
        self._store.close()


@contextlib.contextmanager
def _logging_to_stderr() -> Iterator[None]:
    """What the CLI logs goes to its stderr (INFO and up, DEBUG with WRIT_LOG_LEVEL=DEBUG) while it runs;
    then the loggers are as they were, so `main` run inside another program (a test) leaves no handler
    behind on its root logger and writes to no stream it has finished with."""
    debug = os.environ.get("WRIT_LOG_LEVEL", "").upper() == "DEBUG"
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    levels = {"": logging.DEBUG if debug else logging.INFO, "alembic": logging.WARNING}
    if not debug:
        levels["httpx2"] = logging.WARNING
    before = {name: logging.getLogger(name).level for name in levels}
    root = logging.getLogger()
    root.addHandler(handler)
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
    try:
        yield
    finally:
        root.removeHandler(handler)
        for name, level in before.items():
            logging.getLogger(name).setLevel(level)


def main(argv: Sequence[str] | None = None) -> None:
    """`writ ARGS`: `argv` are the arguments after `writ` (default: this process's own)."""
    with _logging_to_stderr():
        try:
            app(args=argv, prog_name="writ")
        except GatewayError as exc:
            typer.echo(f"writ: {exc}", err=True)
            sys.exit(2)
        except StoreError as exc:  # e.g. the database is down: its reason, not 500 lines of traceback
            typer.echo(f"writ: the store: {exc}", err=True)
            sys.exit(1)
