"""A person settles a call whose outcome is unknown (usually escalated by the reconciler), with evidence.

One service behind `POST /api/calls/{id}/resolution` and the console's resolution form: who may
resolve, tenant scoping, and the refusals both faces translate.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

import anyio.to_thread

from gateway.errors import GatewayError
from store.commands import ResolveManually
from store.limits import SUBJECT_CHARS, refusal, text_unfit
from store.model import CallView, NotFound, StaleLease
from store.ports import ManualResolutions

RESOLVER_ROLES = frozenset({"approver", "admin"})

ResolutionRefusalCode = Literal["insufficient_role", "not_found", "not_unresolved", "invalid_request"]
HTTP_STATUS: dict[ResolutionRefusalCode, int] = {
    "insufficient_role": 403,
    "not_found": 404,
    "not_unresolved": 409,
    "invalid_request": 400,
}


class ResolutionRefused(GatewayError):
    """A resolution that must not be recorded, with its stable code."""

    def __init__(self, code: ResolutionRefusalCode, message: str) -> None:
        super().__init__(message)
        self.code = code

    @property
    def http_status(self) -> int:
        return HTTP_STATUS[self.code]


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
        ResolutionRefused: the role is missing, the evidence empty, the call not found in the tenant,
            or no longer unknown.
    """
    if not resolution.roles & RESOLVER_ROLES:
        raise ResolutionRefused("insufficient_role", "Resolving a call needs the approver or admin role")
    evidence = resolution.evidence.strip()
    if not evidence:
        raise ResolutionRefused("invalid_request", "Say how you know: the evidence is required")
    if (why := text_unfit(evidence)) is not None:
        raise ResolutionRefused("invalid_request", f"the evidence {why}")
    if (message := refusal("the resolver", resolution.resolved_by, SUBJECT_CHARS)) is not None:
        raise ResolutionRefused("invalid_request", message)
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
        raise ResolutionRefused("not_found", "No such tool call") from None
    except StaleLease as exc:
        raise ResolutionRefused("not_unresolved", str(exc)) from exc
