"""A person settles a call whose outcome is unknown (usually escalated by the reconciler), with evidence.

One service behind `POST /api/calls/{id}/resolution`, the console's resolution form and `writ calls
resolve` with a token: who may resolve, tenant scoping, and the refusals the faces translate.

Never the call's own maker. A verdict of `failed` frees the call's key and lets the same call, or a
retry, be sent again: a principal holding the approver role beside the agent's could otherwise settle
its own unanswered refund as failed and send it once more. As with approvals, someone else decides.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import anyio.to_thread

from gateway.errors import Refused
from gateway.reasons import ReasonCode
from store.commands import ResolveManually
from store.limits import SUBJECT_CHARS, refusal, text_unfit
from store.model import CallView, NotFound, StaleLease
from store.ports import ManualResolutions

RESOLVER_ROLES = frozenset({"approver", "admin"})


@dataclass(frozen=True, slots=True)
class ResolutionInput:
    """One resolution, by whom, and what they may do."""

    tool_call_id: str
    succeeded: bool
    evidence: str
    resolved_by: str
    roles: frozenset[str]
    tenant: str


async def resolve_call(store: ManualResolutions, resolution: ResolutionInput, now: datetime) -> CallView:
    """Record the person's verdict on an unknown call of their tenant.

    Raises:
        Refused: the role is missing, the evidence empty, the call not found in the tenant, made by
            the resolver, or no longer unknown.
    """
    if not resolution.roles & RESOLVER_ROLES:
        raise Refused(ReasonCode.INSUFFICIENT_ROLE, "Resolving a call needs the approver or admin role")
    evidence = resolution.evidence.strip()
    if not evidence:
        raise Refused(ReasonCode.INVALID_REQUEST, "Say how you know: the evidence is required")
    if (why := text_unfit(evidence)) is not None:
        raise Refused(ReasonCode.INVALID_REQUEST, f"the evidence {why}")
    if (message := refusal("the resolver", resolution.resolved_by, SUBJECT_CHARS)) is not None:
        raise Refused(ReasonCode.INVALID_REQUEST, message)
    # Who made a call never changes: read before the resolution's own transaction, it stays true.
    call = await anyio.to_thread.run_sync(
        lambda: store.get_call(resolution.tool_call_id, tenant=resolution.tenant)
    )
    if call is None:
        raise Refused(ReasonCode.NOT_FOUND, "No such tool call")
    if call.subject == resolution.resolved_by:
        raise Refused(
            ReasonCode.SELF_RESOLUTION_FORBIDDEN,
            f"{resolution.resolved_by} made this call; someone else settles its outcome",
        )
    try:
        return await anyio.to_thread.run_sync(
            lambda: store.resolve_manually(
                ResolveManually(
                    resolution.tool_call_id,
                    succeeded=resolution.succeeded,
                    evidence=evidence,
                    by=resolution.resolved_by,
                    now=now,
                    tenant=resolution.tenant,
                )
            )
        )
    except NotFound:
        raise Refused(ReasonCode.NOT_FOUND, "No such tool call") from None
    except StaleLease as exc:
        raise Refused(ReasonCode.NOT_UNRESOLVED, str(exc)) from exc
