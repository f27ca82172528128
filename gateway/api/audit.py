"""GET /api/audit/events: the caller's tenant's log for auditors and SIEMs, a page after a cursor.

Always scoped to the caller's tenant: a `tenant` parameter may only repeat it. A page answers with the
events in seq order and `next_after_seq`, the cursor to ask with next (the page's last seq, or the one
asked with when nothing matched yet), so a collector polls with it to follow the log. With
`format=ocsf` each event is its OCSF form (`gateway.audit.ocsf`, as `writ audit export --format ocsf`
writes it); the paging is the same, by the Writ seq each OCSF event keeps as `metadata.sequence`.
"""

from __future__ import annotations

from typing import Any

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.api.guard import Guard, error, refused
from gateway.audit.exporting import event_filter
from gateway.audit.ocsf import ocsf_event
from gateway.auth.oversight import AUDIT_ROLES
from gateway.errors import Refused
from gateway.reasons import ReasonCode
from policy.model import Principal
from store.ports import AuditExport

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
_SINGLE = frozenset({"after_seq", "limit", "since", "until", "principal", "capability", "tenant", "format"})
FORMATS = ("jsonl", "ocsf")
_KNOWN = _SINGLE | {"type"}


def _count(name: str, text: str, *, low: int, high: int) -> int:
    """A whole number in [low, high] given as `name`.

    Raises:
        Refused: it is not one.
    """
    if not text.isascii() or not text.isdigit() or not low <= int(text) <= high:
        raise Refused(
            ReasonCode.INVALID_REQUEST, f"{name}: {text!r} is not a whole number from {low} to {high}"
        )
    return int(text)


class AuditEvents:
    """The handler of GET /api/audit/events."""

    def __init__(self, log: AuditExport) -> None:
        self.log = log

    def route(self, guarded: Guard) -> Route:
        return Route(
            "/api/audit/events",
            guarded(
                self.list,
                roles=AUDIT_ROLES,
                refusal="Exporting the audit log needs the auditor or admin role",
            ),
            methods=["GET"],
        )

    async def list(self, request: Request, who: Principal) -> Response:
        """A page of the caller's tenant's events after `after_seq`, filtered as the CLI filters."""
        params = request.query_params
        unknown = sorted(set(params) - _KNOWN)
        if unknown:
            known = ", ".join(sorted(_KNOWN))
            return error(ReasonCode.INVALID_REQUEST, f"unknown parameter {unknown[0]!r}; known: {known}")
        repeated = sorted(name for name in _SINGLE if len(params.getlist(name)) > 1)
        if repeated:
            return error(ReasonCode.INVALID_REQUEST, f"{repeated[0]}: give it once")
        shape = params.get("format", "jsonl")
        if shape not in FORMATS:
            return error(ReasonCode.INVALID_REQUEST, f"format: {shape!r} is not one of {', '.join(FORMATS)}")
        tenant = params.get("tenant")
        if tenant is not None and tenant != who.tenant:
            return error(ReasonCode.OTHER_TENANT, "An auditor exports the log of their own tenant only")
        try:
            after_seq = _count("after_seq", params.get("after_seq", "0"), low=0, high=2**63 - 1)
            limit = _count("limit", params.get("limit", str(DEFAULT_LIMIT)), low=1, high=MAX_LIMIT)
            given = event_filter(
                tenant=who.tenant,
                since=params.get("since"),
                until=params.get("until"),
                types=params.getlist("type"),
                principal=params.get("principal"),
                capability=params.get("capability"),
            )
        except Refused as exc:
            return refused(exc)
        # One more than the page, to say whether there is more without a second read.
        found: list[dict[str, Any]] = await anyio.to_thread.run_sync(
            lambda: list(self.log.export(given, after_seq=after_seq, limit=limit + 1))
        )
        page = found[:limit]
        return JSONResponse(
            {
                "events": [ocsf_event(e) for e in page] if shape == "ocsf" else page,
                "next_after_seq": page[-1]["seq"] if page else after_seq,
                "has_more": len(found) > limit,
            }
        )
