"""Deciding approvals: one control command shared by the API, the console and the CLI.

A decision only appends `approval.granted` or `approval.rejected`; it never executes anything. The
runtime's resume worker (`gateway/calls/resume.py`) picks up approved calls, re-authorizes and dispatches
them. Every refusal has a stable code, so each face can say exactly why.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import urlsplit

import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field, field_validator

from gateway.errors import Refused
from gateway.reasons import ReasonCode
from store.commands import DecideApproval, ExpireApproval
from store.limits import SUBJECT_CHARS, refusal, text_unfit
from store.model import ApprovalView, NotFound, StaleLease
from store.ports import Approvals

logger = logging.getLogger(__name__)


class WebhookConfig(BaseModel):
    """Where notifications of pending approvals are POSTed, signed with HMAC-SHA256."""

    model_config = ConfigDict(extra="forbid")

    url: str
    secret_env: str = "WRIT_WEBHOOK_SECRET"

    @field_validator("url")
    @classmethod
    def _absolute(cls, url: str) -> str:
        # Checked at start: `hooks.example.com/writ` failed every delivery until each one was dead.
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an absolute http(s) URL, e.g. https://chat.example.com/hooks/writ")
        return url

    """The environment variable holding the signing secret (never the secret itself in the file)."""
    timeout_s: float = Field(default=5.0, gt=0)
    max_attempts: int = Field(default=12, ge=1)
    """After this many failed attempts a message is `dead` (still listed by `writ approvals outbox`)."""
    backoff_initial_s: float = Field(default=1.0, gt=0)
    backoff_max_s: float = Field(default=300.0, gt=0)


class ApprovalsConfig(BaseModel):
    """The `approvals:` section: the resume and expiry worker, notifications, the console link."""

    model_config = ConfigDict(extra="forbid")

    poll_interval_s: float = Field(default=1.0, gt=0)
    """How often every replica looks for approved calls to run and approvals to expire."""
    console_url: str | None = None
    """The console's address in notifications; default `{public_url}/console`."""
    webhook: WebhookConfig | None = None


@dataclass(frozen=True, slots=True)
class DecisionInput:
    """One decision, by whom, and what they may do."""

    approval_id: str
    approve: bool
    decided_by: str
    reason: str | None = None
    roles: frozenset[str] | None = None
    """The decider's roles; None only for a break-glass operator, whom access to the store authorizes."""
    tenant: str | None = None
    """The decider's tenant; approvals of other tenants are not found. None: any tenant (CLI)."""
    break_glass: bool = False
    """An operator deciding at the store without a token (`writ approvals ... --break-glass`)."""


class Decisions:
    """Records decisions; wakes the local resume worker after a grant so the call runs promptly."""

    def __init__(
        self,
        store: Approvals,
        clock: Callable[[], datetime],
        on_granted: Callable[[], None] | None = None,
        *,
        expiring: Approvals | None = None,
    ) -> None:
        """`expiring` records the expiries a decision runs into (default: `store`); the CLI and the
        console hand in the gateway's own store, so an expiry names the producer the expiry worker does."""
        self._store = store
        self._clock = clock
        self._on_granted = on_granted
        self._expiring = store if expiring is None else expiring

    async def decide(self, inp: DecisionInput) -> ApprovalView:
        """Record one decision.

        Raises:
            Refused: not found, not an approver, self-approval (by the call's requester or by whoever
                asked for the retry it is), already decided or expired.
        """
        approval = await anyio.to_thread.run_sync(self.decide_now, inp)
        if approval.status == "approved" and self._on_granted is not None:
            self._on_granted()
        return approval

    def decide_now(self, inp: DecisionInput) -> ApprovalView:
        """The blocking form of `decide`, for the CLI.

        Raises:
            Refused: as `decide`.
        """
        if inp.reason is not None and (why := text_unfit(inp.reason)) is not None:
            # Recording it failed with a database error (a 500): store.limits.
            raise Refused(ReasonCode.INVALID_REQUEST, f"the reason {why}")
        if (message := refusal("the decider", inp.decided_by, SUBJECT_CHARS)) is not None:
            raise Refused(ReasonCode.INVALID_REQUEST, message)
        approval = self._store.get_approval(inp.approval_id, tenant=inp.tenant)
        if approval is None:
            raise Refused(ReasonCode.NOT_FOUND, f"no approval {inp.approval_id}")
        if inp.roles is not None and approval.approver_role not in inp.roles:
            raise Refused(
                ReasonCode.NOT_APPROVER, f"deciding this approval needs the role {approval.approver_role!r}"
            )
        if inp.approve and not approval.requester_may_approve:
            self._check_not_requester(inp.decided_by, approval)
        now = self._clock()
        if approval.status != "awaiting_approval":
            raise self._settled(approval)
        if now >= approval.expires_at:
            self._expire(approval, now)
            raise Refused(ReasonCode.EXPIRED, f"approval {approval.approval_id} expired")
        try:
            return self._store.decide_approval(
                DecideApproval(
                    inp.approval_id,
                    approve=inp.approve,
                    decided_by=inp.decided_by,
                    reason=inp.reason,
                    now=now,
                    tenant=inp.tenant,
                    break_glass=inp.break_glass,
                    # With the decision, the authority it was made with (none known for a CLI operator).
                    decided_by_roles=inp.roles,
                )
            )
        except NotFound as exc:
            raise Refused(ReasonCode.NOT_FOUND, f"no approval {inp.approval_id}") from exc
        except StaleLease as exc:
            # Decided or expired between our read and the store's compare-and-set under the log lock.
            latest = self._store.get_approval(inp.approval_id) or approval
            if latest.status == "awaiting_approval":
                self._expire(latest, now)
                raise Refused(ReasonCode.EXPIRED, f"approval {inp.approval_id} expired") from exc
            raise self._settled(latest) from exc

    def _check_not_requester(self, decider: str, approval: ApprovalView) -> None:
        """Refuse the call's requester, and whoever asked for the retry the call is: a person who
        resolved a call `failed` may retry it, and then someone else approves what it sends again."""
        if decider == approval.requester:
            raise Refused(
                ReasonCode.SELF_APPROVAL_FORBIDDEN,
                f"{decider} requested this call and the policy does not let them approve it",
            )
        if decider == self._store.retry_requested_by(approval.tool_call_id):
            raise Refused(
                ReasonCode.SELF_APPROVAL_FORBIDDEN,
                f"{decider} asked for this retry and the policy does not let a requester approve it",
            )

    @staticmethod
    def _settled(approval: ApprovalView) -> Refused:
        if approval.status == "expired":
            return Refused(ReasonCode.EXPIRED, f"approval {approval.approval_id} expired")
        return Refused(
            ReasonCode.ALREADY_DECIDED,
            f"approval {approval.approval_id} was already {approval.status} by {approval.decided_by}",
        )

    def _expire(self, approval: ApprovalView, now: datetime) -> None:
        # Record the expiry the decision ran into, rather than leave it to the worker's next pass.
        # StaleLease/NotFound: expired or decided by someone else meanwhile; the record already says so.
        with contextlib.suppress(StaleLease, NotFound):
            self._expiring.expire_approval(ExpireApproval(approval.approval_id, now=now))
