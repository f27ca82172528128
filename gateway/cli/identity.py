"""`writ policy ...` and `writ principals ...`: who may do what, for operators (added to `writ` in cli.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Annotated

import typer

from gateway.cli.authority import (
    AsOption,
    BreakGlassOption,
    TokenOption,
    authority,
    check_standing,
)
from gateway.cli.clock import CLOCK
from gateway.cli.refusals import exit_refused
from gateway.config import find_config_file, load_config
from gateway.errors import Refused
from gateway.reasons import ReasonCode
from store.commands import RestorePrincipal, RevokePrincipal
from store.limits import SUBJECT_CHARS, TENANT_CHARS, refusal, text_unfit

policy_app = typer.Typer(help="Dry-run the policy.", no_args_is_help=True)

_ConfigOption = Annotated[
    str | None,
    typer.Option(
        "--config", "-c", help="Config file (default: $WRIT_CONFIG, ./writ.yaml, ./.writ/demo.yaml)."
    ),
]


def _fail(message: str, code: int = 2) -> None:
    typer.echo(f"writ: {message}", err=True)
    raise typer.Exit(code)


@policy_app.command("check")
def policy_check(
    sub: Annotated[str, typer.Option("--sub", help="Subject of the would-be caller.")],
    tool: Annotated[str | None, typer.Option("--tool", help="Tool name, e.g. refund_order.")] = None,
    resource: Annotated[
        str | None,
        typer.Option("--resource", help="Instead of --tool: the URI of a relayed resource to read."),
    ] = None,
    roles: Annotated[str, typer.Option("--roles", help="Comma-separated roles.")] = "",
    tenant: Annotated[str, typer.Option("--tenant", help="Tenant.")] = "default",
    scopes: Annotated[str, typer.Option("--scopes", help="Comma-separated OAuth scopes.")] = "",
    args: Annotated[str, typer.Option("--args", help="The call's arguments as a JSON object.")] = "{}",
    run_call_count: Annotated[
        int, typer.Option("--run-call-count", min=0, help="context.run_call_count: earlier calls in the run.")
    ] = 0,
    run: Annotated[
        str | None, typer.Option("--run", help="Writ's id of the run, for the use of budgets over a run.")
    ] = None,
    at: Annotated[
        str | None,
        typer.Option(
            "--at", help="context.now, ISO 8601 with an offset (default: now), e.g. 2026-12-01T03:00Z."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")] = False,
    config: _ConfigOption = None,
) -> None:
    """Print the decision for one concrete call, its reason, the policy version and the deciding rule."""
    from gateway.cli.policy_check import budget_use, check_policy

    if (tool is None) == (resource is None):
        _fail("name what to check: --tool NAME, or --resource URI (a relayed resource read)")
        return
    try:
        arguments = json.loads(args)
    except json.JSONDecodeError as exc:
        _fail(f"--args is not JSON: {exc}")
        return
    if not isinstance(arguments, dict):
        _fail("--args must be a JSON object")
        return
    now = None
    if at is not None:
        try:
            now = datetime.fromisoformat(at.replace("Z", "+00:00"))
        except ValueError:
            _fail(f"--at is not an ISO 8601 time: {at!r}")
            return
        if now.tzinfo is None:
            _fail("--at needs an offset (Z or +HH:MM): rules compare it with UTC times")
            return
    loaded = load_config(find_config_file(config))
    result = check_policy(
        loaded,
        subject=sub.strip(),
        # As `writ token` mints them: `--roles "agent, approver"` is the role `approver`, not ` approver`.
        roles=[r.strip() for r in roles.split(",") if r.strip()],
        tenant=tenant.strip(),
        scopes=[s.strip() for s in scopes.split(",") if s.strip()],
        tool=tool,
        resource=resource,
        arguments=arguments,
        run_call_count=run_call_count,
        run_id=run,
        now=now if now is not None else CLOCK(),
    )
    result = budget_use(loaded, result)
    typer.echo(json.dumps(result.to_json(), indent=2) if as_json else result.to_text())


principals_app = typer.Typer(help="Manage principals' standing.", no_args_is_help=True)


TenantOption = Annotated[
    str,
    typer.Option(
        "--tenant", help="The tenant the subject acts in (required: a subject's standing is per tenant)."
    ),
]
StandingReasonOption = Annotated[
    str | None, typer.Option("--reason", help="Why (recorded in the event; required with --break-glass).")
]


def _standing_command(revoke: bool, subject_help: str, doc: str) -> Callable[..., None]:
    """`revoke` and `restore` take the same options and differ only in the standing they record."""

    def command(
        tenant: TenantOption,
        sub: str = typer.Argument(help=subject_help),
        reason: StandingReasonOption = None,
        token: TokenOption = None,
        break_glass: BreakGlassOption = False,
        as_: AsOption = None,
        config: _ConfigOption = None,
    ) -> None:
        _change_standing(
            sub,
            tenant,
            revoke=revoke,
            reason=reason,
            token=token,
            break_glass=break_glass,
            as_=as_,
            config=config,
        )

    command.__doc__ = doc
    return command


_REVOKE_HELP = (
    "Refuse every later call, read and decision of SUB in the tenant, and its approved-but-not-run calls."
)
# The line break is the old docstring's, kept: `writ principals --help` shows it.
_RESTORE_HELP = (
    "Lift SUB's revocation in the tenant: what its tokens grant works again (approved calls refused\n"
    "    while it was revoked stay refused)."
)
principals_app.command("revoke")(_standing_command(True, "The subject to revoke.", _REVOKE_HELP))
principals_app.command("restore")(_standing_command(False, "The revoked subject to restore.", _RESTORE_HELP))


def _change_standing(
    sub: str,
    tenant: str,
    *,
    revoke: bool,
    reason: str | None,
    token: str | None,
    break_glass: bool,
    as_: str | None,
    config: str | None,
) -> None:

    from gateway.cli.stores import opened_store
    from store.model import NotFound

    sub, tenant = sub.strip(), tenant.strip()
    named = [("SUB", sub, SUBJECT_CHARS), ("--tenant", tenant, TENANT_CHARS)]
    for message in filter(None, (refusal(*n) for n in named)):
        _fail(message)
    if reason is not None and (why := text_unfit(reason)) is not None:
        _fail(f"--reason {why}")
    cfg = load_config(find_config_file(config))
    try:
        who = authority(cfg, token=token, break_glass=break_glass, reason=reason, impersonated=as_)
    except Refused as exc:
        exit_refused(exc)
    act = "revoking" if revoke else "restoring"
    if who.principal is not None:
        if "admin" not in who.principal.roles:
            exit_refused(Refused(ReasonCode.INSUFFICIENT_ROLE, f"{act} a principal needs the admin role"))
        if who.principal.tenant != tenant:
            exit_refused(
                Refused(
                    ReasonCode.OTHER_TENANT,
                    f"the token is for tenant {who.principal.tenant}, not {tenant}; nothing was recorded",
                )
            )
    store = opened_store(cfg)
    ended = 0
    try:
        try:
            check_standing(store, who)
        except Refused as exc:
            exit_refused(exc)
        now = CLOCK()
        if revoke:
            seen = store.tenants_of(sub)
            if seen and tenant not in seen:
                # `--tenant default` for a subject that works in `acme` said "revoked" and changed nothing.
                _fail(
                    f"{sub} was never seen in tenant {tenant}; seen in: {', '.join(seen)}. "
                    "Nothing was recorded: name the tenant it acts in",
                    1,
                )
            revocation = store.revoke_principal(
                RevokePrincipal(
                    tenant,
                    sub,
                    revoked_by=who.name,
                    reason=reason,
                    now=now,
                    break_glass=who.break_glass,
                )
            )
            ended = revocation.grants_revoked or 0
        else:
            try:
                store.restore_principal(
                    RestorePrincipal(
                        tenant,
                        sub,
                        restored_by=who.name,
                        reason=reason,
                        now=now,
                        break_glass=who.break_glass,
                    )
                )
            except NotFound as exc:
                _fail(f"{exc}; nothing was recorded", 1)
    finally:
        store.close()
    mark = " (break-glass)" if who.break_glass else ""
    done = "revoked" if revoke else "restored"
    typer.echo(f"{done} {sub} in tenant {tenant} at {now.isoformat()} by {who.name}{mark}")
    if revoke and ended:
        # Their refresh tokens (and the access tokens of those sign-ins) stop working now.
        typer.echo(
            f"ended {ended} sign-in{'s' if ended != 1 else ''} of {sub} at Writ's authorization server"
        )
