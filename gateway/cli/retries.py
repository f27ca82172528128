"""`writ calls retry ID`: re-run a failed call as a new call (added to `writ calls` in main.py).

A retry is a decision: made with a token (`--token` or $WRIT_TOKEN, checked as the API checks it:
role approver or admin, the token's tenant, standing) or as an explicit break-glass operator
(`--break-glass --reason R`), recorded as such (`gateway.cli.authority`). The retry runs here, through
the gateway's own pipeline built from the config: policy, budgets, loops and a stopped run decide it
now; one the policy sends to approval waits for a person, and a running `writ serve` executes it
once approved.
"""

from __future__ import annotations

import json
from typing import Annotated

import anyio
import typer

from gateway.cli.authority import BreakGlassOption, TokenOption, authority, check_standing
from gateway.cli.refusals import exit_refused
from gateway.config import find_config_file, load_config
from gateway.errors import Refused

_ConfigOption = Annotated[
    str | None,
    typer.Option(
        "--config", "-c", help="Config file (default: $WRIT_CONFIG, ./writ.yaml, ./.writ/demo.yaml)."
    ),
]


def calls_retry(
    tool_call_id: str,
    reason: Annotated[
        str | None, typer.Option("--reason", "-r", help="Why it is sent again (recorded with who; required).")
    ] = None,
    token: TokenOption = None,
    break_glass: BreakGlassOption = False,
    config: _ConfigOption = None,
) -> None:
    """Re-run a failed call as a new call, authorized now; same key only if its backend deduplicates."""
    from gateway.api.retries import retry_json
    from gateway.app import build_runtime
    from gateway.calls.retries import RetryRequest, retry_call

    cfg = load_config(find_config_file(config))
    try:
        who = authority(cfg, token=token, break_glass=break_glass, reason=reason)
    except Refused as exc:
        exit_refused(exc)
    principal = who.principal
    said = reason or ""  # none given with a token: the service refuses it, saying why
    req = RetryRequest(
        tool_call_id=tool_call_id,
        by=who.name,
        reason=said,
        roles=principal.roles if principal else None,
        tenant=principal.tenant if principal else None,
    )
    runtime = build_runtime(cfg)

    async def run() -> dict[str, object]:
        await runtime.registry.start()
        try:
            runtime.pipeline.prepare()
            report = await retry_call(
                req, store=runtime.store, registry=runtime.registry, pipeline=runtime.pipeline
            )
            return retry_json(tool_call_id, report.kind, report.reported)
        finally:
            await runtime.registry.close()

    try:
        try:
            check_standing(runtime.store, who)
            body = anyio.run(run)
        except Refused as exc:
            exit_refused(exc)
    finally:
        runtime.telemetry.shutdown()
        runtime.store.close()
    typer.echo(json.dumps(body | {"breakGlass": who.break_glass}, indent=2, default=str))
