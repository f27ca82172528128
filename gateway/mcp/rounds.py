"""What a call may become on MCP 2026-07-28 besides a result: a confirmation round or a task.

A call of a `confirm` capability asks the user in the client (SEP-2322 input-required): an elicitation
form with the exact effect, and a `requestState` naming the call, its confirmation and its action hash.
The SDK's `RequestStateBoundary` seals that state (AES-GCM, bound to the tool, the arguments' digest,
the caller and a TTL) under the configured keys, which every replica shares, or else under a key this
process generated at start, so that state from before a restart or from another process is refused
before Writ reads it; the store consumes the confirmation once, so a replayed answer runs nothing.

A call that waits for an approver may be a task (SEP-2663, `io.modelcontextprotocol/tasks`) for a
client that declares the extension on the request: the task id is the toolCallId, `tasks/get` reports
`working` until the call settles and then `completed` with the result the call would have returned.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import mcp_types as types
from mcp.server.request_state import RequestStateBoundary, RequestStateSecurity
from mcp.shared.exceptions import MCPError
from mcp_types import METHOD_NOT_FOUND, MISSING_REQUIRED_CLIENT_CAPABILITY
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import Field

from gateway.errors import ConfigurationError
from gateway.reasons import ReasonCode
from store.model import TERMINAL_STATUSES, CallView

CONFIRM_KEY = "writ/confirm"
"""The key of the confirmation request in `inputRequests` / `inputResponses`."""
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
TASK_POLL_MS = 1000
_STATE_VERSION = 1


_MIN_KEY_BYTES = 32


def sealing(ttl_s: float, keys: Sequence[bytes] = ()) -> RequestStateSecurity:
    """How `requestState` is sealed: under shared `keys` (the first seals), or a key made now if none.

    Raises:
        ConfigurationError: a key is too short, or two keys are the same.
    """
    if not keys:
        return RequestStateSecurity.ephemeral(ttl=ttl_s)
    try:
        return RequestStateSecurity(keys=list(keys), ttl=ttl_s)
    except ValueError as exc:
        raise ConfigurationError(f"confirmations.key_file: {exc}") from exc


def read_keys(path: Path) -> tuple[bytes, ...]:
    """The sealing keys in a key file: one per non-empty line, surrounding whitespace not included.

    Raises:
        ConfigurationError: the file cannot be read, holds no key, or a line is under 32 bytes.
    """
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise ConfigurationError(f"confirmations.key_file: cannot read {path}: {exc.strerror}") from exc
    keys = []
    for number, line in enumerate(lines, start=1):
        key = line.strip()
        if not key:
            continue
        if len(key) < _MIN_KEY_BYTES:  # the length only: never a key's text in a message
            raise ConfigurationError(
                f"confirmations.key_file: line {number} of {path} has {len(key)} bytes; a key needs "
                f"at least {_MIN_KEY_BYTES} of secret randomness (e.g. `openssl rand -base64 48`)"
            )
        keys.append(key)
    if not keys:
        raise ConfigurationError(f"confirmations.key_file: {path} holds no key")
    return tuple(keys)


def request_state_boundary(security: RequestStateSecurity, audience: str) -> RequestStateBoundary:
    """Seals and verifies `requestState` for this server (`audience`) as `security` says."""
    return RequestStateBoundary(security, default_audience=audience)


def is_modern(ctx: Any) -> bool:
    return getattr(ctx, "protocol_version", None) in MODERN_PROTOCOL_VERSIONS


def _client_capabilities(ctx: Any) -> types.ClientCapabilities | None:
    session = getattr(ctx, "session", None)
    return getattr(session, "client_capabilities", None) if session is not None else None


def can_confirm(ctx: Any) -> bool:
    """The client takes input-required rounds (2026-07-28) and form elicitation (a bare `{}` is form)."""
    capabilities = _client_capabilities(ctx)
    elicitation = capabilities.elicitation if capabilities else None
    if not is_modern(ctx) or elicitation is None:
        return False
    return elicitation.form is not None or elicitation.url is None


def wants_tasks(ctx: Any) -> bool:
    """The client declared the tasks extension on this request (never return a task otherwise)."""
    capabilities = _client_capabilities(ctx)
    extensions = capabilities.extensions if capabilities else None
    return is_modern(ctx) and bool(extensions) and TASKS_EXTENSION in (extensions or {})


def require_tasks(ctx: Any) -> None:
    """`tasks/get`, `tasks/update` and `tasks/cancel` only for a request that declares the extension.

    SEP-2663: without it the methods are refused with -32021 naming the extension (SEP-2575), never
    answered (a task is never created for such a request either). A 2025-11-25 client is never offered
    the extension, so for it the methods do not exist.

    Raises:
        MCPError: -32021 (2026-07-28 request without the extension) or -32601 (2025-11-25).
    """
    if wants_tasks(ctx):
        return
    if not is_modern(ctx):
        raise MCPError(METHOD_NOT_FOUND, "Method not found")
    required = types.MissingRequiredClientCapabilityErrorData(
        required_capabilities=types.ClientCapabilities(extensions={TASKS_EXTENSION: {}})
    )
    raise MCPError(
        MISSING_REQUIRED_CLIENT_CAPABILITY,
        f"Client did not declare the {TASKS_EXTENSION!r} extension on this request",
        data=required.model_dump(by_alias=True, mode="json", exclude_none=True),
    )


def ask_to_confirm(call: CallView, capability_ref: str) -> types.InputRequiredResult:
    """The input-required round for a call awaiting confirmation: the exact effect, bound state."""
    message = (
        f"Confirm this action: {call.summary} ({capability_ref}), requested by {call.subject}. "
        "Accept to run it once; decline to cancel it."
    )
    state = {"v": _STATE_VERSION, "tc": call.tool_call_id, "cf": call.confirmation_id, "h": call.action_hash}
    request = types.ElicitRequest(
        params=types.ElicitRequestFormParams(
            message=message, requested_schema={"type": "object", "properties": {}}
        )
    )
    return types.InputRequiredResult(
        input_requests={CONFIRM_KEY: request},
        request_state=json.dumps(state, separators=(",", ":")),
        meta={"writ/toolCallId": call.tool_call_id, "writ/status": call.status},
    )


def read_state(text: str) -> tuple[str, str, str] | None:
    """(tool_call_id, confirmation_id, action_hash) from our own unsealed state, or None if not ours."""
    try:
        state = json.loads(text)
        if state.get("v") != _STATE_VERSION:
            return None
        tool_call_id, confirmation_id, action = state["tc"], state["cf"], state["h"]
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    if not all(isinstance(v, str) and v for v in (tool_call_id, confirmation_id, action)):
        return None
    return tool_call_id, confirmation_id, action


def answer_of(responses: types.InputResponses | None) -> Literal["accept", "decline", "cancel"] | None:
    """The user's action (`accept`, `decline`, `cancel`) from the retry's responses, if it carries one."""
    response = (responses or {}).get(CONFIRM_KEY)
    return response.action if isinstance(response, types.ElicitResult) else None


def refusal(reason: ReasonCode | str, detail: str, tool_call_id: str | None) -> types.CallToolResult:
    """A confirmation answer that ran nothing (used before, expired, rebound, no longer allowed)."""
    body = {
        "status": "denied",
        "reason": reason,
        "toolCallId": tool_call_id,
        "next": (
            "Nothing was run for this answer. Do not re-send it; check the call with writ_call_status, "
            "or make the call again to be asked again."
        ),
    }
    return types.CallToolResult.model_validate(
        {
            "content": [
                {"type": "text", "text": f"Confirmation refused ({reason}): {detail}. {body['next']}"}
            ],
            "structuredContent": body,
            "isError": True,
        }
    )


class TaskParams(types.RequestParams):
    task_id: str = Field(alias="taskId")


def task_of(
    call: CallView, final_result: dict[str, Any] | None, status_message: str, *, withdrawn: bool = False
) -> dict[str, Any]:
    """The SEP-2663 `Task` for a call: `working` until it settles, then `completed` with its result.

    `failed` is reserved by SEP-2663 for JSON-RPC errors; a backend failure or a refusal is a tool
    result (`isError` or a status) and so a `completed` task, as the synchronous call would return it.
    A call its requester withdrew (`tasks/cancel` while it waited for an approver) is `cancelled`.
    """
    settled = "cancelled" if withdrawn else "completed"
    task: dict[str, Any] = {
        "taskId": call.tool_call_id,
        "status": settled if call.status in TERMINAL_STATUSES else "working",
        "statusMessage": status_message,
        "createdAt": call.created_at.isoformat(),
        "lastUpdatedAt": call.updated_at.isoformat(),
        "ttlMs": None,
        "pollIntervalMs": TASK_POLL_MS,
    }
    if task["status"] == "completed" and final_result is not None:
        task["result"] = final_result
    return task
