"""The structured state Writ reports for a call (DESIGN §6): one pydantic model, so the JSON a client
reads and the `outputSchema` `writ_call_status` publishes come from the same place.

Fields are set only where Writ says something; `dump` leaves every unset field out, so a document
carries exactly the keys it always did, in the order declared here.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from store.model import CallStatus, VerificationStatus

ReportedStatus = CallStatus | Literal["not_found"]
Reconciliation = Literal["pending", "escalated", "contradicted"]


class Effect(BaseModel):
    """What the call does, as a person reads it: `refund-order@2`, `refund 250.00 EUR to order 1001`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    capability: str
    summary: str


class BudgetState(BaseModel):
    """The budget a refused call would have passed: its limit, what is used, and when it resets."""

    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True)

    id: str
    limit: float
    used: float
    amount: float
    resets_at: str | None = Field(default=None, description="ISO 8601; null: at the end of the run")


class LoopState(BaseModel):
    """The loop a refused call belongs to: the rule, its threshold and window, the calls that made it."""

    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True)

    rule: str
    kind: str = Field(description="repeated_action, near_identical or repeated_failure")
    threshold: int
    window_s: int
    resets_at: str = Field(description="ISO 8601: when the window ends")
    tool_call_ids: list[str] = Field(description="the earlier calls of the pattern in the window")
    run_stopped: str | None = Field(
        default=None, description="the run Writ stopped for this loop: its calls wait for a person"
    )


class StatusDocument(BaseModel):
    """A call's state as `structuredContent` (and the API's call bodies) report it."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True, title="WritCallStatus"
    )

    status: ReportedStatus
    tool_call_id: str | None = None
    existing_tool_call_id: str | None = None
    approval_id: str | None = None
    expires_at: str | None = Field(default=None, description="ISO 8601")
    effect: Effect | None = None
    reason: str | None = None
    message: str | None = Field(default=None, description="The policy rule's message for the user")
    policy_version: str | None = None
    reconciliation: Reconciliation | None = None
    detail: str | None = Field(
        default=None,
        description="What the backend said of an unknown call's effect: a tool's own error message "
        "(it may have acted before it failed), the answer to a re-send",
    )
    error: str | None = None
    errors: list[str] | None = None
    input_schema: dict[str, Any] | None = None
    retry_after_s: float | None = None
    budget: BudgetState | None = None
    loop: LoopState | None = None
    verification: VerificationStatus | None = None
    created_at: str | None = Field(default=None, description="ISO 8601")
    updated_at: str | None = Field(default=None, description="ISO 8601")
    result: dict[str, Any] | None = Field(default=None, description="The backend's result, once completed")
    next: str | None = Field(default=None, description="What the client should do now")

    def dump(self) -> dict[str, Any]:
        """The document as JSON: camelCase names, only the fields that were set."""
        return self.model_dump(by_alias=True, exclude_unset=True)


def output_schema() -> dict[str, Any]:
    """The JSON schema of a `writ_call_status` result's `structuredContent`."""
    return StatusDocument.model_json_schema(by_alias=True, mode="serialization")
