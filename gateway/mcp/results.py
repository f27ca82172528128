"""What the client hears: a call's recorded state, shaped as an MCP tool result (DESIGN §6).

A completed call returns the backend's result unchanged plus Writ's ids in `_meta`. Anything else is
a state the model can act on, with `next` telling it what to do instead of guessing.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from typing import Any

import anyio.to_thread

from capabilities.contract import Capability
from gateway.calls.pipeline import CallReport
from gateway.mcp.documents import BudgetState, Effect, LoopState, StatusDocument
from gateway.reasons import ReasonCode
from store.model import Breach, CallView, LoopHit, StoredEvent, StoreError
from store.ports import CallStatus

logger = logging.getLogger(__name__)

NEXT = {
    "approval_pending": (
        "Do not call again. A human must approve this action; check with writ_call_status "
        "using the toolCallId."
    ),
    "result_unknown": (
        "Do not call again: the backend never answered and may still act. Writ looks the outcome up "
        "before anything is retried; check with writ_call_status using the toolCallId."
    ),
    "dispatching": "The same call is already in progress. Do not call again; check with writ_call_status.",
    "requested": "The call is recorded and not yet dispatched. Check with writ_call_status.",
    "approved": "Approved; the call is about to run. Check with writ_call_status.",
    "awaiting_confirmation": (
        "The user is asked to confirm this action in the client. Do not call again; check with "
        "writ_call_status."
    ),
    "denied": "Do not retry this call unchanged; it was refused by policy. Tell the user why.",
    "rejected": "A human rejected this action. Do not retry it; tell the user.",
    "expired": "The approval expired before anyone decided. Ask the user before requesting it again.",
    "failed": "The backend answered with an error. Read the error before deciding whether to try again.",
}

# A failure Writ settled by reconciliation is not the backend's answer: say how it was established.
# Not "the backend never answered": a call left unknown by a tool's error was answered, then settled so.
FAILED_BY = {
    "no_effect_after_horizon": (
        "The call's outcome was not known when it was made. Writ looked the request up after its commit "
        "horizon (the time past which it can no longer take effect) and it had not happened: nothing "
        "was done. Ask the user before trying again."
    ),
    "backend_reported_failure": (
        "The call's outcome was not known when it was made; looked up afterwards, the backend reports "
        "the effect failed. Nothing was done; read the error before deciding whether to try again."
    ),
    "resolved_failed_by_hand": (
        "The call's outcome was not known when it was made; a person checked and recorded that it did "
        "not happen. Ask the user before trying again."
    ),
}

# A failure the backend did not answer: "answered with an error" would be untrue. Writ knows these
# requests were never delivered (or never started), or, for reads, which change nothing, went unanswered;
# a write that may have been delivered and went unanswered is `result_unknown`, never `failed`.
_NOT_SENT = (
    "Nothing was done: the request never reached the backend. Try again later, or tell the user if it "
    "keeps failing."
)
FAILED_UNANSWERED = {
    "backend_unreachable": (
        "The backend could not be reached (it may be down), so the request was never delivered. " + _NOT_SENT
    ),
    "request_error": "Writ could not send the request. " + _NOT_SENT,
    "threads_busy": "The backend had no free thread and the call never started. " + _NOT_SENT,
    "invalid_arguments": "Writ could not build the request from the arguments. " + _NOT_SENT,
    "lease_expired_before_dispatch": "Writ's dispatch lease ran out before the request was sent. "
    + _NOT_SENT,
    "unknown_capability": "The backend does not serve this tool. " + _NOT_SENT,
    "timeout": "The backend did not answer this read in time. A read changes nothing; it may be tried again.",
    "connection_lost": (
        "The connection to the backend was lost before it answered this read. A read changes nothing; "
        "it may be tried again."
    ),
    "cancelled_by_client": "This read was cancelled before the backend answered. It changes nothing.",
    "executor_timeout": "No outcome of this read came back in time. A read changes nothing; try again.",
    "executor_error": "Writ failed to run this read (see its log). A read changes nothing; tell the user.",
    "undecodable_response": (
        "The backend answered this read with something Writ could not decode. Read the error before "
        "deciding whether to try again."
    ),
    "response_too_large": (
        "The backend's answer to this read was larger than Writ accepts. Read the error before deciding "
        "whether to try again."
    ),
    "invalid_response": (
        "The backend's answer to this read was not a valid result. Read the error before deciding "
        "whether to try again."
    ),
}

_NOT_ANSWERED = {**FAILED_BY, **FAILED_UNANSWERED}
"""Every failure the backend did not answer, and what to say of it instead of "it answered"."""

# An unknown outcome the backend did answer: "it never answered" would be untrue.
UNKNOWN_BY = {
    "tool_error": (
        "Do not call again: the tool reported an error, but it may have acted before it failed. Writ "
        "looks the outcome up before anything is retried; check with writ_call_status using the "
        "toolCallId."
    ),
}

# Whatever left it unknown: no answer, a tool's error, re-sends answered with refusals (the answer's own
# text says which); "the backend never answered" would be untrue of the last two.
ESCALATED = (
    "Do not call again: the backend may have acted, and Writ could not learn the outcome from it, so a "
    "person is checking; check with writ_call_status using the toolCallId."
)

CONTRADICTED = (
    "Do not call again: Writ's recorded outcome of this call is contradicted by later evidence (it may "
    "have taken effect after all, or not). A person is checking; check with writ_call_status."
)


def outcome_text(call: CallView) -> str:
    """One line on what Writ knows of the call's effect, in the words the model and the console use."""
    if call.contradicted:
        return CONTRADICTED
    if call.status == "failed":
        return _NOT_ANSWERED.get(call.error or "", NEXT["failed"])
    if call.escalated:
        return ESCALATED
    if call.status == "result_unknown" and call.error in UNKNOWN_BY:
        return UNKNOWN_BY[call.error or ""]
    return NEXT.get(call.status, "")


_WRIT_REASONS = frozenset(ReasonCode)


def rule_message(call: CallView, decision: Mapping[str, Any] | None = None) -> str | None:
    """The `message` of the policy rule that denied `call`, or that sent it to an approver, as the
    operator wrote it for the user; None when no rule did (Writ's own refusals and a budget's approval:
    their text is for the record, not the model) or the rule has none.

    A denial's message is kept in the call's `error`. A pending approval's is read from `decision`,
    the policy decision recorded with the call's intent (the `decision` of its `tool_call.requested`):
    the call's row has no field for it while it waits.
    """
    if call.reason is None or call.reason in _WRIT_REASONS:
        return None
    if call.status == "denied":
        return call.error or None
    if call.status != "approval_pending" or decision is None:
        return None
    message = decision.get("message")
    if decision.get("reason") != call.reason or not isinstance(message, str) or not message.strip():
        return None
    if message.startswith(f"decided by rule {decision.get('rule_id')!r}"):
        return None  # recorded before a rule's message was kept apart: Writ's own words, not the rule's
    return message


def recorded_decision(events: Iterable[StoredEvent]) -> Mapping[str, Any] | None:
    """The policy decision recorded with a call's intent (its `tool_call.requested`), of the call's
    events: the rule, its reason and its message (`rule_message`), as approvers and clients see them."""
    requested = next((e for e in events if e.type == "tool_call.requested"), None)
    decision = requested.payload.get("decision") if requested is not None else None
    return decision if isinstance(decision, Mapping) else None


def unknown_detail(events: Iterable[StoredEvent]) -> str | None:
    """What the backend said of a call's effect that left it unknown, of the call's events: the
    `detail` of its latest `tool_call.result_unknown` (a tool's own error message, which may follow
    its effect; the refusal of a re-send), if it has one."""
    said = None
    for event in events:
        if event.type == "tool_call.result_unknown":
            detail = event.payload.get("detail")
            said = detail if isinstance(detail, str) and detail else None
    return said


async def recorded_detail(store: CallStatus, call: CallView) -> str | None:
    """`unknown_detail` of a call of unknown outcome; None for any other call, and when the log cannot
    be read now (as for `pending_decision`)."""
    if call.status != "result_unknown":
        return None
    tool_call_id = call.tool_call_id
    try:
        found = await anyio.to_thread.run_sync(lambda: store.events(tool_call_id=tool_call_id))
    except StoreError as exc:
        logger.warning("the outcome recorded with %s was not read: %s", tool_call_id, exc)
        return None
    return unknown_detail(found)


async def pending_decision(store: CallStatus, call: CallView) -> Mapping[str, Any] | None:
    """The policy decision recorded with a call waiting for an approver (its first event, the
    `tool_call.requested`): where its rule's message is kept. None for any other call, and when the
    log cannot be read now: the message is worth less than telling the client its call's state."""
    if call.status != "approval_pending":
        return None
    tool_call_id = call.tool_call_id
    try:
        found = await anyio.to_thread.run_sync(lambda: store.events(tool_call_id=tool_call_id, limit=1))
    except StoreError as exc:
        logger.warning("the decision recorded with %s was not read: %s", tool_call_id, exc)
        return None
    return recorded_decision(found)


def writ_meta(call: CallView) -> dict[str, Any]:
    """Writ's ids of a call, the `_meta` of what it answers (an upstream's own `_meta` is not passed on)."""
    meta = {
        "writ/toolCallId": call.tool_call_id,
        "writ/status": call.status,
        "writ/runId": call.run_id,
        "writ/idempotencyKey": call.idempotency_key,
    }
    if call.run_id is None:  # a call in no run (no runId, no session): nothing to name
        del meta["writ/runId"]
    return meta


def _effect(call: CallView) -> Effect:
    return Effect(capability=f"{call.capability_id}@{call.capability_version}", summary=call.summary)


def shape_report(
    report: CallReport, decision: Mapping[str, Any] | None = None, detail: str | None = None
) -> dict[str, Any]:
    """The CallToolResult (as JSON) for what the pipeline just did; `decision` and `detail` as for
    `shape_call`."""
    call = report.reported
    if not report.recorded:
        headline = (
            f"Outcome unknown: {call.summary} was sent, but its answer could not be recorded (store down)."
        )
        return _status_result(call, status_document(call), headline)
    if report.kind == "invalid_arguments":
        errors = list(report.validation_errors)
        text = f"Invalid arguments for {report.capability.tool_name}: " + "; ".join(errors)
        return {
            "content": [{"type": "text", "text": text}],
            "structuredContent": StatusDocument(
                status="denied",
                reason=ReasonCode.INVALID_ARGUMENTS,
                tool_call_id=call.tool_call_id,
                errors=errors,
                input_schema=dict(report.capability.input_schema),
                next="Fix the arguments to match the tool's input schema and call again.",
            ).dump(),
            "isError": True,
            "_meta": writ_meta(call),
        }
    if report.kind == "conflict":
        existing = report.existing
        body = StatusDocument(
            status="denied",
            reason=ReasonCode.IDEMPOTENCY_CONFLICT,
            tool_call_id=call.tool_call_id,
            existing_tool_call_id=existing.tool_call_id if existing else None,
            policy_version=call.policy_version,
            next=(
                "This idempotency key already names a different action. Use a new key for a new action, "
                "or re-send the original arguments to get the original call's state."
            ),
        ).dump()
        return _status_result(call, body, "Refused: idempotency key reused for a different action.")
    if report.breach is not None:
        return budget_exceeded(call, report.breach)
    if report.loop is not None:
        return loop_detected(call, report.loop)
    if call.status == "denied" and call.reason == ReasonCode.RUN_STOPPED:
        return run_stopped(call)
    return shape_call(call, report.capability, decision, detail)


RUN_STOPPED_NEXT = (
    "A person stopped this run: none of its calls runs until they resume it. Stop: do not retry this "
    "call or another. Report to your user what you were doing, and wait for them."
)


def run_stopped(call: CallView) -> dict[str, Any]:
    """The CallToolResult (as JSON) for a call refused because a person stopped its run."""
    body = StatusDocument(
        status="denied",
        reason=ReasonCode.RUN_STOPPED,
        tool_call_id=call.tool_call_id,
        policy_version=call.policy_version,
        next=RUN_STOPPED_NEXT,
    ).dump()
    return _status_result(call, body, f"Denied: a person stopped this run ({call.summary}).")


def budget_exceeded(call: CallView, breach: Breach) -> dict[str, Any]:
    """The CallToolResult (as JSON) for a call refused because it would pass a budget."""
    resets = None if breach.resets_at is None else breach.resets_at.isoformat()
    until = resets or "the end of this run"
    body = StatusDocument(
        status="denied",
        reason=ReasonCode.BUDGET_EXCEEDED,
        tool_call_id=call.tool_call_id,
        policy_version=call.policy_version,
        budget=BudgetState(
            id=breach.budget_id,
            limit=breach.limit_micros / 1_000_000,
            used=breach.used_micros / 1_000_000,
            amount=breach.amount_micros / 1_000_000,
            resets_at=resets,
        ),
        next=f"Budget {breach.budget_id} is used up until {until}; do not retry before then; tell the user.",
    ).dump()
    return _status_result(call, body, f"Denied: budget {breach.budget_id} is used up ({call.summary}).")


LOOP_NEXT = (
    "You have made this call, or nearly the same one, too often: it looks like a loop. Stop: do not "
    "retry it or a variant of it. Report to your user what you were trying to do and what went wrong."
)


def loop_detected(call: CallView, loop: LoopHit) -> dict[str, Any]:
    """The CallToolResult (as JSON) for a call refused because it repeats a pattern too often."""
    paused = {"run_stopped": loop.paused_run} if loop.paused_run else {}
    told = LOOP_NEXT
    if loop.paused_run:
        told += (
            f" Writ has stopped run {loop.paused_run}: its calls are refused until a person resumes it, "
            "so tell your user now."
        )
    body = StatusDocument(
        status="denied",
        reason=ReasonCode.LOOP_DETECTED,
        tool_call_id=call.tool_call_id,
        policy_version=call.policy_version,
        loop=LoopState(
            rule=loop.rule_id,
            kind=loop.kind,
            threshold=loop.threshold,
            window_s=loop.window_s,
            resets_at=loop.resets_at.isoformat(),
            tool_call_ids=list(loop.tool_call_ids),
            **paused,
        ),
        next=told,
    ).dump()
    return _status_result(call, body, f"Denied: loop detected by rule {loop.rule_id} ({call.summary}).")


def rate_limited(tool_name: str, retry_after_s: float) -> dict[str, Any]:
    """The CallToolResult (as JSON) for a call refused by a rate limit, which left no record."""
    # Rounded up, so a client that waits exactly this long is not refused again for a rounding.
    wait = math.ceil(retry_after_s * 1000) / 1000
    text = f"Rate limited: too many calls. Nothing was done; call {tool_name} again in {wait} s."
    body = StatusDocument(
        status="denied",
        reason=ReasonCode.RATE_LIMITED,
        retry_after_s=wait,
        next=f"Nothing was recorded or run. Wait {wait} s before calling again.",
    ).dump()
    return {"content": [{"type": "text", "text": text}], "structuredContent": body, "isError": False}


def shape_call(
    call: CallView,
    capability: Capability | None = None,
    decision: Mapping[str, Any] | None = None,
    detail: str | None = None,
) -> dict[str, Any]:
    """The CallToolResult (as JSON) for a call's recorded state; `decision`, the policy decision
    recorded with it, tells a pending approval's rule message (`rule_message`); `detail`, what the
    backend said of an unknown call's effect (`unknown_detail`), is told with it."""
    if call.contradicted:
        return _status_result(call, status_document(call), f"Outcome contradicted: {call.summary}.")
    if call.status == "completed" and call.result is not None:
        result = dict(call.result)
        return {
            "content": result.get("content") or [],
            "structuredContent": result.get("structuredContent"),
            "isError": False,
            "_meta": writ_meta(call),
        }
    if call.status == "failed":
        result = dict(call.result or {})
        said = (
            outcome_text(call)
            if call.error in _NOT_ANSWERED
            else f"The backend answered with an error: {call.error or 'unknown error'}."
        )
        content = result.get("content") or [{"type": "text", "text": said}]
        return {
            "content": content,
            "structuredContent": result.get("structuredContent")
            or StatusDocument(
                status="failed", tool_call_id=call.tool_call_id, error=call.error, next=outcome_text(call)
            ).dump(),
            "isError": True,
            "_meta": writ_meta(call),
        }
    body = status_document(call, decision=decision, detail=detail)
    return _status_result(call, body, _headline(call, body.get("message"), body.get("detail")))


def status_document(
    call: CallView,
    *,
    include_result: bool = False,
    decision: Mapping[str, Any] | None = None,
    detail: str | None = None,
) -> dict[str, Any]:
    """The structured state of a call, as `writ_call_status` and non-final results report it."""
    return status_model(call, include_result=include_result, decision=decision, detail=detail).dump()


def status_model(
    call: CallView,
    *,
    include_result: bool = False,
    decision: Mapping[str, Any] | None = None,
    detail: str | None = None,
) -> StatusDocument:
    """The `StatusDocument` of a call's recorded state; `decision` and `detail` as for `shape_call`."""
    said: dict[str, Any] = {}
    if call.status == "approval_pending":
        said["approval_id"] = call.approval_id
        if call.approval_expires_at is not None:
            said["expires_at"] = call.approval_expires_at.isoformat()
    if call.status == "denied":
        said["reason"] = call.reason
        said["policy_version"] = call.policy_version
    if (message := rule_message(call, decision)) is not None:
        said["message"] = message
    if call.status == "result_unknown":
        # Escalated: reconciliation gave up and a person must settle it (`writ calls resolve`).
        said["reconciliation"] = "escalated" if call.escalated else "pending"
        if detail:
            said["detail"] = detail
    if call.contradicted:
        said["reconciliation"] = "contradicted"
    if call.status == "failed" and call.error:
        said["error"] = call.error
    if include_result and call.result is not None:
        said["result"] = dict(call.result)
    if call.status == "expired" and call.reason == "confirmation_expired":
        said["next"] = "The user did not confirm in time; nothing was run. Ask the user before trying again."
    elif call.status in NEXT or call.contradicted:
        said["next"] = outcome_text(call)
    return StatusDocument(
        status=call.status,
        tool_call_id=call.tool_call_id,
        effect=_effect(call),
        verification=call.verification_status,
        created_at=call.created_at.isoformat(),
        updated_at=call.updated_at.isoformat(),
        **said,
    )


def _status_result(call: CallView, body: Mapping[str, Any], text: str) -> dict[str, Any]:
    return {
        "content": [{"type": "text", "text": f"{text} {body.get('next', '')}".strip()}],
        "structuredContent": dict(body),
        "isError": False,
        "_meta": writ_meta(call),
    }


def _headline(call: CallView, message: str | None, detail: str | None = None) -> str:
    summary = call.summary
    says = f" The policy says: {message.rstrip()}" if message else ""
    match call.status:
        case "approval_pending":
            return f"Waiting for human approval: {summary}.{says}"
        case "result_unknown":
            return _unknown_headline(call, detail)
        case "denied":
            return f"Denied by policy ({call.reason}): {summary}.{says}"
        case "dispatching":
            return f"In progress: {summary}."
        case _:
            return f"{call.status.replace('_', ' ').capitalize()}: {summary}."


def _unknown_headline(call: CallView, detail: str | None) -> str:
    said = f" It said: {detail.rstrip()}" if detail else ""
    error = call.error or "no reply"
    if call.error == "tool_error":
        return f"Outcome unknown: {call.summary}: the tool reported an error, possibly after it acted.{said}"
    if call.attempts > 1:
        return (
            f"Outcome unknown: {call.summary} was sent {call.attempts} times under the same key, and no "
            f"answer settled it ({error}).{said}"
        )
    return f"Outcome unknown: {call.summary} was sent, but no answer came back ({error})."


MISSING_CAPABILITY_ERROR = "mcp_error_32021"
"""How a call an upstream refused with -32021 (a client capability it needs is missing) is recorded."""


def missing_capability(report: CallReport) -> tuple[str, dict[str, Any]] | None:
    """An upstream's -32021 refusal of a call, passed on as such: the message and the error's data
    (the upstream's `requiredCapabilities` with the call's status document), else None.

    SEP-2575 makes it a JSON-RPC error, not a tool error, so that a client can tell it must declare
    the capability (and answer it with HTTP 400 on 2026-07-28).
    """
    call = report.reported
    if call.status != "failed" or call.error != MISSING_CAPABILITY_ERROR or call.result is None:
        return None
    required = (call.result.get("structuredContent") or {}).get("requiredCapabilities")
    if not isinstance(required, dict):
        return None
    texts = [b.get("text") for b in call.result.get("content") or () if isinstance(b, Mapping)]
    message = next((t for t in texts if isinstance(t, str)), "A client capability the tool needs is missing")
    return message, {"requiredCapabilities": required, **status_document(call)}
