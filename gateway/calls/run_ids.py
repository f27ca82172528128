"""Which run a call is in: the client's `writ/runId`, else its MCP session, else none.

A client names its run with any string it likes, and another agent of the tenant (or of another
tenant) may name one the same. Writ's run id is therefore derived from the tenant, the subject and the
client's string: the same principal naming the same string is in the same run, anyone else naming it
is in a run of their own, and no client can name a run it did not start.

A client that names no run is grouped by its MCP session where the protocol has one (a 2025-11-25
streamable HTTP session, a `writ stdio` process): the run is Writ's, derived from the principal and the
session id the same way, so a budget or a stop over the run holds whether or not the client cooperates.
A 2026-07-28 client has no session: its calls without a runId are in no run (the principal's and
tenant's budgets and loop rules still count them).
"""

from __future__ import annotations

import hashlib

from policy.model import Principal
from store.canonical import canonical_json
from store.model import RunOrigin


def scoped_run_id(principal: Principal, client_run_id: str) -> str:
    """Writ's id for the run `principal` calls `client_run_id`."""
    body = canonical_json([principal.tenant, principal.subject, client_run_id])
    return "run_" + hashlib.sha256(body.encode()).hexdigest()[:40]


def session_run_id(principal: Principal, session_id: str) -> str:
    """Writ's id for the run of `principal`'s calls in MCP session `session_id`."""
    # Four parts where a client's run has three: no runId a client sends can name a session's run.
    body = canonical_json([principal.tenant, principal.subject, "mcp-session", session_id])
    return "run_" + hashlib.sha256(body.encode()).hexdigest()[:40]


def run_of(
    principal: Principal, client_run_id: str | None, session_id: str | None
) -> tuple[str | None, RunOrigin | None]:
    """The run a call is in and what groups it: the client's runId, its session, or (None, None)."""
    # Never the client's string itself: that would let another principal name (and so read and
    # count into) a run it did not start, or fail on one of the same name in another tenant.
    if client_run_id:
        return scoped_run_id(principal, client_run_id), "client"
    if session_id:
        return session_run_id(principal, session_id), "session"
    return None, None
