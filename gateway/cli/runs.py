"""`writ runs list|show|stop|resume`: runs for operators (added to `writ` in main.py).

A stop or resume is a decision: made with a token (`--token` or $WRIT_TOKEN, checked as the API
checks it: role approver or admin, the token's tenant, standing) or as an explicit break-glass
operator (`--break-glass --reason R`), recorded as such (`gateway.cli.authority`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated

import typer

from gateway.cli.authority import BreakGlassOption, TokenOption, authority, check_standing
from gateway.cli.clock import CLOCK
from gateway.cli.refusals import exit_refused
from gateway.config import find_config_file, load_config
from gateway.display import visible_line
from gateway.errors import Refused

runs_app = typer.Typer(help="See, stop and resume runs.", no_args_is_help=True)

_ConfigOption = Annotated[
    str | None,
    typer.Option(
        "--config", "-c", help="Config file (default: $WRIT_CONFIG, ./writ.yaml, ./.writ/demo.yaml)."
    ),
]
_ReasonOption = Annotated[
    str | None, typer.Option("--reason", "-r", help="Why (recorded with who; required).")
]


@runs_app.command("list")
def runs_list(
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's runs.")] = None,
    status: Annotated[str | None, typer.Option(help="Only runs that are active or stopped.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many, newest first.")] = 100,
    config: _ConfigOption = None,
) -> None:
    """List runs, newest first: whose, what groups them, how many calls, and whether stopped."""
    with _opened(config) as store:
        runs = store.list_runs(tenant=tenant, status=status, limit=limit)
    if not runs:
        typer.echo("no runs")
    for r in runs:
        stopped = (
            f"  stopped by {visible_line(r.stopped_by or '')}: {visible_line(r.stop_reason or '')}"
            if r.status == "stopped"
            else ""
        )
        typer.echo(
            f"{r.run_id}  {r.status:<7} tenant={r.tenant} subject={visible_line(r.subject)} "
            f"origin={r.origin or '-'} calls={r.call_count} started={r.started_at.isoformat()}{stopped}"
        )


@runs_app.command("show")
def runs_show(run_id: str, config: _ConfigOption = None) -> None:
    """Show one run: its state, its calls and the budgets they drew on (JSON)."""
    from gateway.api.runs import detail_json
    from gateway.calls.runs import run_detail

    with _opened(config) as store:
        detail = run_detail(store, run_id, None)
    if detail is None:
        typer.echo(f"writ: no run {run_id!r}", err=True)
        raise typer.Exit(1)
    typer.echo(json.dumps(detail_json(detail), indent=2, default=str))


def _control_command(stop: bool, doc: str) -> Callable[..., None]:
    """`stop` and `resume` take the same options and differ only in what they record."""

    def command(
        run_id: str,
        reason: _ReasonOption = None,
        token: TokenOption = None,
        break_glass: BreakGlassOption = False,
        config: _ConfigOption = None,
    ) -> None:
        _control(run_id, stop, reason=reason, token=token, break_glass=break_glass, config=config)

    command.__doc__ = doc
    return command


runs_app.command("stop")(
    _control_command(
        True, "Stop a run: its later calls are refused run_stopped and its waiting approvals withdrawn."
    )
)
runs_app.command("resume")(_control_command(False, "Resume a stopped run: it takes calls again."))


def _control(
    run_id: str, stop: bool, *, reason: str | None, token: str | None, break_glass: bool, config: str | None
) -> None:
    from gateway.api.runs import run_json
    from gateway.calls.runs import RunControl, resume_run, stop_run

    cfg = load_config(find_config_file(config))
    try:
        who = authority(cfg, token=token, break_glass=break_glass, reason=reason)
    except Refused as exc:
        exit_refused(exc)
    principal = who.principal
    said = reason or ""  # none given with a token: the service refuses it, saying why
    with _opened(config) as store:
        try:
            check_standing(store, who)
            control = RunControl(
                run_id=run_id,
                by=who.name,
                reason=said,
                roles=principal.roles if principal else None,
                tenant=principal.tenant if principal else None,
                now=CLOCK(),
            )
            run = stop_run(store, control) if stop else resume_run(store, control)
        except Refused as exc:
            exit_refused(exc)
    typer.echo(json.dumps(run_json(run) | {"breakGlass": who.break_glass}, indent=2))


class _opened:
    """Open the configured store for one command (migrated or refused), close it after."""

    def __init__(self, config: str | None) -> None:
        self._config = config

    def __enter__(self):  # type: ignore[no-untyped-def]
        from gateway.cli.stores import opened_store

        self._store = opened_store(load_config(find_config_file(self._config)))
        return self._store

    def __exit__(self, *exc: object) -> None:
        self._store.close()
