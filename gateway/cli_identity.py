"""`writ policy ...` and `writ principals ...`: who may do what, for operators (added to `writ` in cli.py)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated

import typer

from gateway.config import find_config_file, load_config
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
    tool: Annotated[str, typer.Option("--tool", help="Tool name, e.g. refund_order.")],
    roles: Annotated[str, typer.Option("--roles", help="Comma-separated roles.")] = "",
    tenant: Annotated[str, typer.Option("--tenant", help="Tenant.")] = "default",
    scopes: Annotated[str, typer.Option("--scopes", help="Comma-separated OAuth scopes.")] = "",
    args: Annotated[str, typer.Option("--args", help="The call's arguments as a JSON object.")] = "{}",
    run_call_count: Annotated[
        int, typer.Option("--run-call-count", min=0, help="context.run_call_count: earlier calls in the run.")
    ] = 0,
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
    from gateway.policy_check import check_policy

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
    result = check_policy(
        load_config(find_config_file(config)),
        subject=sub.strip(),
        # As `writ token` mints them: `--roles "agent, approver"` is the role `approver`, not ` approver`.
        roles=[r.strip() for r in roles.split(",") if r.strip()],
        tenant=tenant.strip(),
        scopes=[s.strip() for s in scopes.split(",") if s.strip()],
        tool=tool,
        arguments=arguments,
        run_call_count=run_call_count,
        now=now,
    )
    typer.echo(json.dumps(result.to_json(), indent=2) if as_json else result.to_text())


principals_app = typer.Typer(help="Manage principals' standing.", no_args_is_help=True)


@principals_app.command("revoke")
def principals_revoke(
    sub: Annotated[str, typer.Argument(help="The subject to revoke.")],
    tenant: Annotated[str, typer.Option("--tenant", help="Tenant.")] = "default",
    reason: Annotated[str | None, typer.Option("--reason", help="Why (recorded in the event).")] = None,
    by: Annotated[str, typer.Option("--as", help="Who revokes (recorded).")] = "cli",
    config: _ConfigOption = None,
) -> None:
    """Refuse every later call, and every approved-but-not-run call, of SUB in the tenant."""
    from datetime import UTC, datetime

    from gateway.app import open_store

    named = [("SUB", sub, SUBJECT_CHARS), ("--tenant", tenant, TENANT_CHARS), ("--as", by, SUBJECT_CHARS)]
    for message in filter(None, (refusal(*n) for n in named)):
        _fail(message)
    if reason is not None and (why := text_unfit(reason)) is not None:
        _fail(f"--reason {why}")
    store = open_store(load_config(find_config_file(config)), migrate_empty=False)
    try:
        revocation = store.revoke_principal(tenant, sub, revoked_by=by, reason=reason, now=datetime.now(UTC))
    finally:
        store.close()
    typer.echo(
        f"revoked {revocation.subject} in tenant {revocation.tenant} at {revocation.revoked_at.isoformat()}"
    )
