"""`POST /api/calls/{id}/retry`: a person with role approver or admin re-runs a failed call of their
tenant, with a reason in the body (`gateway.calls.retries`). The answer is the retry's status
document (it may itself be pending approval, denied, completed or failed) with `retryOf`."""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.api.guard import Guard, PrincipalOf, invalid_body, refused
from gateway.calls.retries import (
    MAX_REASON,
    RETRY_ROLES,
    Calling,
    Capabilities,
    RetryRequest,
    retry_call,
)
from gateway.errors import Refused
from gateway.mcp.results import status_document
from policy.model import Principal
from store.model import CallView
from store.ports import CallReads, Standing


class RetryBody(BaseModel):
    """POST /api/calls/{id}/retry: why (recorded with who)."""

    model_config = ConfigDict(extra="forbid")

    reason: str = Field(min_length=1, max_length=MAX_REASON)


class _Store(CallReads, Standing, Protocol):
    pass


class RetriesApi:
    def __init__(self, store: CallReads, registry: Capabilities, pipeline: Calling) -> None:
        self.store = store
        self.registry = registry
        self.pipeline = pipeline

    async def retry(self, request: Request, who: Principal) -> Response:
        """POST /api/calls/{id}/retry: `tool_call.retry_requested`, then the retry as a new call."""
        try:
            body = RetryBody.model_validate_json(await request.body() or b"{}")
        except ValidationError as exc:
            return invalid_body(exc)
        req = RetryRequest(
            tool_call_id=request.path_params["tool_call_id"],
            by=who.subject,
            reason=body.reason,
            roles=who.roles,
            tenant=who.tenant,
        )
        try:
            report = await retry_call(req, store=self.store, registry=self.registry, pipeline=self.pipeline)
        except Refused as exc:
            return refused(exc)
        return JSONResponse(retry_json(req.tool_call_id, report.kind, report.reported))


def retry_json(original: str, kind: str, call: CallView) -> dict[str, Any]:
    """The retry as the API and `writ calls retry` show it."""
    return status_document(call, include_result=True) | {
        "retryOf": original,
        "idempotencyKey": call.idempotency_key,
        "admission": kind,
    }


def retry_routes(
    store: _Store, registry: Capabilities, pipeline: Calling, principal_of: PrincipalOf, metadata_url: str
) -> list[Route]:
    """The retry route, behind the guard (token, standing, role approver or admin)."""
    api = RetriesApi(store, registry, pipeline)
    guarded = Guard(store, principal_of, metadata_url)
    return [
        Route(
            "/api/calls/{tool_call_id}/retry",
            guarded(api.retry, roles=RETRY_ROLES, refusal="Retrying a call needs the approver or admin role"),
            methods=["POST"],
        )
    ]
