"""`writ oauth clients list|show|revoke`: the OAuth clients signed in at Writ's authorization server.

`list` and `show` read the store as `writ calls list` does (whoever holds the config holds the database).
`revoke` acts with authority, as `writ principals revoke` does: with an admin's token for its tenant, or
`--break-glass --reason R`; it ends every sign-in of the client in the tenant and records
`oauth.client_revoked`.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any

import typer

from gateway.cli.authority import AsOption, BreakGlassOption, TokenOption, authority, check_standing
from gateway.cli.clock import CLOCK
from gateway.cli.refusals import exit_refused
from gateway.config import WritConfig, find_config_file, load_config
from gateway.display import visible_line
from gateway.errors import Refused
from gateway.reasons import ReasonCode
from store.limits import TENANT_CHARS, refusal, text_unfit
from store.model import NotFound
from store.oauth_clients import RevokeClient

oauth_app = typer.Typer(help="Writ's OAuth authorization server.", no_args_is_help=True)
clients_app = typer.Typer(help="The clients signed in at it, and their sign-ins.", no_args_is_help=True)
oauth_app.add_typer(clients_app, name="clients")

_ConfigOption = Annotated[
    str | None,
    typer.Option(
        "--config", "-c", help="Config file (default: $WRIT_CONFIG, ./writ.yaml, ./.writ/demo.yaml)."
    ),
]
_JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]


def _fail(message: str, code: int = 2) -> None:
    typer.echo(f"writ: {message}", err=True)
    raise typer.Exit(code)


def _config(path: str | None) -> WritConfig:
    return load_config(find_config_file(path))


def _tenant(tenant: str | None) -> str | None:
    if tenant is None:
        return None
    tenant = tenant.strip()
    if (message := refusal("--tenant", tenant, TENANT_CHARS)) is not None:
        _fail(message)
    return tenant


def _time(moment: datetime | None) -> str:
    return moment.isoformat(timespec="seconds") if moment is not None else "-"


@clients_app.command("list")
def clients_list(
    tenant: Annotated[str | None, typer.Option(help="Only sign-ins in this tenant (default: all).")] = None,
    as_json: _JsonOption = False,
    config: _ConfigOption = None,
) -> None:
    """The clients that signed someone in, with how many sign-ins of each are live."""
    from gateway.cli.stores import opened_store

    cfg = _config(config)
    scope = _tenant(tenant)
    with opened_store(cfg) as store:
        now = CLOCK()  # once the store has set it by the database's clock
        clients = store.oauth_clients(
            tenant=scope, now=now, live_after=cfg.auth.authorization_server.liveness().live_after(now)
        )
    if as_json:
        typer.echo(json.dumps({"tenant": scope, "clients": [c.to_json() for c in clients]}, indent=2))
        return
    if not clients:
        typer.echo("no clients have signed anyone in" + (f" in tenant {scope}" if scope else ""))
    for c in clients:
        typer.echo(
            f"{visible_line(c.client_id)}  live={c.live_sign_ins} last={_time(c.last_sign_in_at)} "
            f"{c.kind} {visible_line(c.name or '(no name)')}"
        )


@clients_app.command("show")
def clients_show(
    client_id: str = typer.Argument(
        help="The client id (a URL for a client known by its metadata document)."
    ),
    tenant: Annotated[str | None, typer.Option(help="Only sign-ins in this tenant (default: all).")] = None,
    as_json: _JsonOption = False,
    config: _ConfigOption = None,
) -> None:
    """One client and its live sign-ins: who, since when, last refreshed, until when."""
    from gateway.cli.stores import opened_store

    cfg = _config(config)
    scope = _tenant(tenant)
    with opened_store(cfg) as store:
        now = CLOCK()  # once the store has set it by the database's clock
        try:
            detail = store.oauth_client(
                client_id,
                tenant=scope,
                now=now,
                live_after=cfg.auth.authorization_server.liveness().live_after(now),
            )
        except NotFound as exc:
            _fail(str(exc), 1)
            return
    if as_json:
        typer.echo(json.dumps(detail.to_json(), indent=2))
        return
    c = detail.client
    typer.echo(f"client {visible_line(c.client_id)}: {visible_line(c.name or '(no name)')} ({c.kind})")
    typer.echo(f"redirect URIs: {', '.join(visible_line(u) for u in detail.redirect_uris) or '-'}")
    typer.echo(f"live sign-ins: {len(detail.sign_ins)}")
    for s in detail.sign_ins:
        typer.echo(
            f"  {s.family_id}  {visible_line(s.subject)} tenant={s.tenant} signed_in={_time(s.signed_in_at)} "
            f"refreshed={_time(s.last_refreshed_at)} refresh_expires={_time(s.refresh_expires_at)}"
        )


@clients_app.command("revoke")
def clients_revoke(
    client_id: str = typer.Argument(help="The client whose sign-ins to end."),
    tenant: Annotated[
        str | None,
        typer.Option(
            help="The tenant whose sign-ins end (default: the token's; required with --break-glass)."
        ),
    ] = None,
    reason: Annotated[
        str | None, typer.Option("--reason", help="Why (recorded in the event; required with --break-glass).")
    ] = None,
    token: TokenOption = None,
    break_glass: BreakGlassOption = False,
    as_: AsOption = None,
    config: _ConfigOption = None,
) -> None:
    """End every sign-in of the client in the tenant (its tokens stop working now; oauth.client_revoked).

    The client may ask people to sign in again; to keep a person out, revoke the principal."""
    from gateway.cli.stores import opened_store

    scope = _tenant(tenant)
    if reason is not None and (why := text_unfit(reason)) is not None:
        _fail(f"--reason {why}")
    cfg = _config(config)
    try:
        who = authority(cfg, token=token, break_glass=break_glass, reason=reason, impersonated=as_)
    except Refused as exc:
        exit_refused(exc)
    if who.principal is not None:
        if "admin" not in who.principal.roles:
            exit_refused(
                Refused(ReasonCode.INSUFFICIENT_ROLE, "revoking a client's sign-ins needs the admin role")
            )
        if scope is not None and scope != who.principal.tenant:
            exit_refused(
                Refused(
                    ReasonCode.OTHER_TENANT,
                    f"the token is for tenant {who.principal.tenant}, not {scope}; nothing was recorded",
                )
            )
        scope = who.principal.tenant
    if scope is None:
        _fail("--break-glass needs --tenant T: sign-ins are ended one tenant at a time")
        return
    with opened_store(cfg) as store:
        try:
            check_standing(store, who)
        except Refused as exc:
            exit_refused(exc)
        command = RevokeClient(
            client_id, scope, revoked_by=who.name, now=CLOCK(), reason=reason, break_glass=who.break_glass
        )
        try:
            revoked = store.revoke_oauth_client(command)
        except NotFound as exc:
            _fail(f"{exc}; nothing was recorded", 1)
            return
    body: dict[str, Any] = revoked.to_json()
    mark = " (break-glass)" if revoked.break_glass else ""
    ended = body["signInsEnded"]
    typer.echo(
        f"revoked client {visible_line(client_id)} in tenant {scope} at {body['revokedAt']} "
        f"by {who.name}{mark}: ended {ended} sign-in{'s' if ended != 1 else ''}"
    )
