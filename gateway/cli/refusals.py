"""How the CLI says a refusal: one line on stderr and an exit status, the same for every command."""

from __future__ import annotations

from typing import NoReturn

import typer

from gateway.errors import Refused
from gateway.reasons import ReasonCode

PLAIN = frozenset({ReasonCode.INVALID_COMMAND, ReasonCode.INVALID_TOKEN})
"""Refusals of how the command was called or of who calls it: the sentence alone says it."""

EXIT_STATUS: dict[str, int] = {ReasonCode.INVALID_COMMAND: 2}
"""2 for how the command was called (as for a usage error); 1 for every other refusal."""


def exit_refused(exc: Refused) -> NoReturn:
    """Say the refusal (`writ: refused (code): ...`) and exit; nothing was recorded."""
    said = str(exc) if exc.code in PLAIN else f"refused ({exc.code}): {exc}"
    typer.echo(f"writ: {said}", err=True)
    raise typer.Exit(EXIT_STATUS.get(exc.code, 1)) from exc
