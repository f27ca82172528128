"""Who a CLI decision is made by: a verified token's principal, or an explicit break-glass operator.

`writ approvals approve|reject`, `writ calls resolve` and `writ principals revoke|restore` act on the
store directly, so a name typed at the shell proves nothing. Either the command carries a token
(`--token` or `$WRIT_TOKEN`), checked exactly as /api checks it (issuer, audience, expiry, then role,
tenant, separation of duties and standing by the same services), or, with no token, the operator says
`--break-glass --reason R`: recorded as `operator:<os-user>@<host>` with `break_glass: true` in the
event, never under another person's name.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import anyio
import typer

from gateway.auth.standing import is_revoked_now, revoked_text
from gateway.config import WritConfig
from gateway.errors import Refused
from gateway.reasons import ReasonCode
from policy.model import Principal

if TYPE_CHECKING:
    from gateway.auth.issuers import TrustedIssuer
    from store.ports import Standing

CLI = "writ-cli"
"""The producer every event the CLI records names."""

TokenOption = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar="WRIT_TOKEN",
        show_envvar=True,
        help="Act as this bearer token's principal, checked as the API checks it.",
    ),
]
BreakGlassOption = Annotated[
    bool,
    typer.Option(
        "--break-glass",
        help="No token: act as operator:<os-user>@<host>, marked break-glass in the log (needs --reason).",
    ),
]
AsOption = Annotated[str | None, typer.Option("--as", hidden=True)]
ByOption = Annotated[str | None, typer.Option("--by", hidden=True)]

HOW = (
    "use --token (or $WRIT_TOKEN) to act as the token's principal, or, with no token, "
    "--break-glass --reason R to act as operator:<os-user>@<host>, marked break-glass in the log"
)


@dataclass(frozen=True, slots=True)
class Authority:
    """Who acts: `principal` for a verified token, None for a break-glass operator."""

    name: str
    principal: Principal | None
    reason: str | None

    @property
    def break_glass(self) -> bool:
        return self.principal is None


def operator_name() -> str:
    """`operator:<os-user>@<host>`: the shell account and machine a break-glass act came from."""
    try:
        user = getpass.getuser()
    except (OSError, KeyError):  # no $USER and no passwd entry (a bare container): the uid says who
        user = f"uid{os.getuid()}"
    return f"operator:{user}@{socket.gethostname()}"


def authority(
    config: WritConfig,
    *,
    token: str | None,
    break_glass: bool,
    reason: str | None,
    impersonated: str | None = None,
    flag: str = "--as",
) -> Authority:
    """Who this command acts as.

    Raises:
        Refused: a name was given (`--as`), both or neither of a token and --break-glass, a
            break-glass act without a reason, or a token that does not verify.
    """
    if impersonated is not None:
        raise Refused(
            ReasonCode.INVALID_COMMAND, f"{flag} is gone: a name typed here proves nothing. Instead, {HOW}"
        )
    token = (token or "").strip() or None
    if token is not None and break_glass:
        raise Refused(
            ReasonCode.INVALID_COMMAND,
            "--break-glass is for acting without a token, and a token was given (--token or $WRIT_TOKEN): "
            "drop one of them",
        )
    if break_glass:
        if not (reason or "").strip():
            raise Refused(
                ReasonCode.INVALID_COMMAND,
                "--break-glass needs --reason R: why you act without a token is recorded",
            )
        return Authority(operator_name(), None, reason)
    if token is None:
        raise Refused(ReasonCode.INVALID_COMMAND, f"this acts with authority and no token was given: {HOW}")
    return Authority(*_verified(config, token), reason)


def _verified(config: WritConfig, token: str) -> tuple[str, Principal]:
    from gateway.app import token_verifier
    from gateway.auth.tokens import principal_from_claims
    from gateway.opening import dev_issuer_for

    if token.lower().startswith("bearer "):
        token = token[7:].strip()
    with contextlib.ExitStack() as stack:
        verifier = token_verifier(config, dev_issuer_for(config), own=_own_issuer(config, stack))
        access = anyio.run(verifier.verify_token, token)
    if access is None:
        raise Refused(
            ReasonCode.INVALID_TOKEN,
            "the token did not verify (expired, wrong audience, unknown issuer or bad signature); "
            "nothing was recorded",
        )
    principal = principal_from_claims(access.claims or {}, config.auth.claims)
    return principal.subject, principal


def _own_issuer(config: WritConfig, stack: contextlib.ExitStack) -> TrustedIssuer | None:
    """Writ's authorization server, when it runs and has made its keys: its tokens are taken here as
    at the gateway, and refused once their sign-in is revoked (so the store is opened to ask)."""
    section = config.auth.authorization_server
    if not section.enabled or not Path(section.key_file).exists():
        return None
    from gateway.app import own_issuer
    from gateway.cli.stores import opened_store
    from gateway.oauth import settings_for
    from gateway.oauth.keys import SigningKeys

    store = stack.enter_context(opened_store(config))
    return own_issuer(settings_for(config).issuer, SigningKeys.load_or_create(section.key_file), store)


def check_standing(store: Standing, who: Authority) -> None:
    """Raises Refused when the token's principal is revoked in its tenant (break-glass has no standing)."""
    if who.principal is not None and is_revoked_now(store, who.principal):
        raise Refused(ReasonCode.PRINCIPAL_REVOKED, revoked_text(who.principal))
