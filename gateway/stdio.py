"""`writ stdio`: MCP over stdin/stdout for one local client (Claude Desktop, Claude Code).

There is no HTTP request to carry a bearer token, so the caller's token comes from $WRIT_TOKEN and is
verified exactly as on /mcp, once at start. Logs go to stderr: stdout belongs to the protocol.
"""

from __future__ import annotations

import functools
import os
import time
import uuid

import anyio
from mcp.server.stdio import stdio_server

from gateway.app import build_runtime, parked_calls
from gateway.auth.tokens import ClaimsRejected, TokenRejected
from gateway.calls.catalogue import Catalogue
from gateway.config import WritConfig
from gateway.errors import AuthenticationError
from gateway.mcp.server import build_mcp_server


def serve_stdio(config: WritConfig) -> None:
    """Run until stdin closes.

    Raises:
        AuthenticationError: $WRIT_TOKEN is missing or does not verify.
    """
    runtime = build_runtime(config)
    raw = os.environ.get("WRIT_TOKEN", "").strip()
    if not raw:
        raise AuthenticationError("writ stdio needs the caller's token in $WRIT_TOKEN (see `writ token`)")
    try:
        token = anyio.run(functools.partial(runtime.verifier.verify_token, raw, explain=True))
    except ClaimsRejected as exc:
        raise AuthenticationError(f"$WRIT_TOKEN cannot be used: {exc}") from exc
    except TokenRejected as exc:
        raise AuthenticationError(f"$WRIT_TOKEN did not verify: {exc.public}") from exc
    if token is None:  # not reached: with `explain`, a refused token raises
        raise AuthenticationError("$WRIT_TOKEN did not verify")
    principal = runtime.principal_from_claims(token.claims or {})
    expires_at = token.expires_at or 0
    # Checked on every request: a token that expires mid-session stops being honoured.
    server = build_mcp_server(
        runtime.pipeline,
        Catalogue(runtime.registry, runtime.policy_source),
        runtime.store,
        lambda: principal if time.time() < expires_at else None,
        clock=runtime.clock,
        telemetry=runtime.telemetry,
        sealing=runtime.sealing,
        registry=runtime.registry,
        security=runtime.security,
        transport="pipe",
        # One client for the life of this process: its calls without a runId are one run.
        process_session=uuid.uuid4().hex,
        parked=parked_calls(runtime),
    )

    async def main() -> None:
        async with runtime.running(), stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(main)
