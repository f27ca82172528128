"""The MCP tasks extension (SEP-2663): a call waiting for an approver is a task the client polls.

Against the whole gateway served in this process (`inproc_sqlite_gateway`): the official client of the
2026-07-28 era, with the extension, over real HTTP.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.shared.exceptions import MCPError
from pydantic import Field, TypeAdapter

from tests.e2e.harness import Backend, Gateway
from tests.eventually import eventually
from tests.gateway.mcp import inproc
from tests.gateway.mcp.test_mcp_shaping import GOODWILL, GOODWILL_SAYS

pytestmark = pytest.mark.anyio


# One gateway and backend for the module (conftest): every case sends its own idempotency key, and a
# task left waiting for an approver stays apart from the others.
@pytest.fixture
def sqlite_gateway(inproc_sqlite_gateway: Gateway) -> Gateway:
    return inproc_sqlite_gateway


@pytest.fixture
def backend(inproc_sqlite_backend: Backend) -> Backend:
    return inproc_sqlite_backend


class CreateTaskResult(types.Result):
    result_type: Literal["task"] = "task"
    task_id: str
    status: str
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    ttl_ms: int | None = None
    poll_interval_ms: int | None = None


class TaskParams(types.RequestParams):
    task_id: str = Field(alias="taskId")


class GetTaskRequest(types.Request[TaskParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskParams


class UpdateTaskRequest(types.Request[TaskParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    params: TaskParams


class CancelTaskRequest(types.Request[TaskParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskParams


class Tasks(ClientExtension):
    """A minimal client side of the extension: declare it, and poll `tasks/get` to the final result."""

    identifier = "io.modelcontextprotocol/tasks"

    def __init__(self, on_created: Callable[[CreateTaskResult], None]) -> None:
        self.on_created = on_created
        self.created: list[CreateTaskResult] = []
        self.polled: list[str] = []

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=CreateTaskResult, resolve=self.resolve)]

    async def resolve(self, created: CreateTaskResult, ctx: ClaimContext) -> types.CallToolResult:
        self.created.append(created)
        await anyio.to_thread.run_sync(self.on_created, created)
        with anyio.fail_after(20):
            while True:
                task = await ctx.session.send_request(
                    GetTaskRequest(params=TaskParams(taskId=created.task_id)), TypeAdapter(dict[str, Any])
                )
                self.polled.append(task["status"])
                if task["status"] in ("completed", "failed", "cancelled"):
                    return types.CallToolResult.model_validate(task["result"])
                await anyio.sleep(0.1)


class Left(Tasks):
    """The client side of a requester who takes the task a call became and stops the call right there.

    The call ends when the task is created, not after a fixed time: under load a timer could end it
    before the answer came (no task), or with its POST in flight, whose late answer the SDK's transport
    then hands to the session it already closed (BrokenResourceError at the client's exit). Here no
    request of the call is in flight when it stops.
    """

    def __init__(self, stop: anyio.CancelScope) -> None:
        super().__init__(lambda created: None)
        self.stop = stop

    async def resolve(self, created: CreateTaskResult, ctx: ClaimContext) -> types.CallToolResult:
        self.created.append(created)
        self.stop.cancel()
        await anyio.sleep_forever()
        raise AssertionError("the call went on after its scope was cancelled")


def approve(gateway: Gateway, decision: str = "approve") -> Callable[[CreateTaskResult], None]:
    def decide(task: CreateTaskResult) -> None:
        headers = {"Authorization": f"Bearer {gateway.token('bob', roles='approver')}"}
        call = httpx2.get(f"{gateway.url}/api/calls/{task.task_id}", headers=headers, timeout=10).json()
        answer = httpx2.post(
            f"{gateway.url}/api/approvals/{call['approvalId']}/decision",
            json={"decision": decision, "reason": "checked"},
            headers=headers,
            timeout=10,
        )
        assert answer.status_code == 200, answer.text

    return decide


def refund(amount: float = 250) -> dict[str, Any]:
    return {"order_id": "1002", "amount": amount, "currency": "EUR", "reason": "damaged in transit"}


async def test_a_call_waiting_for_approval_is_a_working_task_that_completes_after_the_approval(
    sqlite_gateway: Gateway, backend: Backend
) -> None:
    tasks = Tasks(approve(sqlite_gateway))
    async with sqlite_gateway.client(
        sqlite_gateway.token("alice"), mode="2026-07-28", extensions=[tasks]
    ) as client:
        result = await client.call_tool("refund_order", refund(), meta={"writ/idempotencyKey": "task-1"})

    [created] = tasks.created
    assert (created.status, created.ttl_ms, created.poll_interval_ms) == ("working", None, 1000)
    assert "is approval_pending" in (created.status_message or "")
    assert tasks.polled[-1] == "completed" and set(tasks.polled[:-1]) <= {"working"}
    assert result.meta is not None and result.meta["writ/toolCallId"] == created.task_id
    assert result.meta["writ/status"] == "completed"
    assert len(backend.refunds("task-1")) == 1


async def test_a_rejected_task_completes_with_the_rejection_the_call_would_have_returned(
    sqlite_gateway: Gateway, backend: Backend
) -> None:
    tasks = Tasks(approve(sqlite_gateway, "reject"))
    async with sqlite_gateway.client(
        sqlite_gateway.token("alice"), mode="2026-07-28", extensions=[tasks]
    ) as client:
        result = await client.call_tool("refund_order", refund(), meta={"writ/idempotencyKey": "task-2"})

    assert result.structured_content["status"] == "rejected"
    assert backend.refunds("task-2") == []


async def test_a_client_without_the_extension_gets_approval_pending_not_a_task(
    sqlite_gateway: Gateway,
) -> None:
    async with sqlite_gateway.client(sqlite_gateway.token("alice"), mode="2026-07-28") as client:
        result = await client.call_tool("refund_order", refund(), meta={"writ/idempotencyKey": "task-3"})
    assert result.structured_content["status"] == "approval_pending"


async def test_the_task_methods_refuse_a_request_without_the_extension(sqlite_gateway: Gateway) -> None:
    # SEP-2663 (the conformance suite's tasks-capability-negotiation): -32021 naming the extension,
    # even for a task that exists; a 2025-11-25 client is never offered tasks, so they do not exist.
    created = await _task_created_and_left(sqlite_gateway, "task-4")  # nobody approves it here
    params = TaskParams(taskId=created.task_id)
    requests = [
        GetTaskRequest(params=params),
        UpdateTaskRequest(params=params),
        CancelTaskRequest(params=params),
    ]
    for mode, code in (("2026-07-28", -32021), ("legacy", -32601)):
        async with sqlite_gateway.client(sqlite_gateway.token("alice"), mode=mode) as client:
            for request in requests:
                with pytest.raises(MCPError) as refused:
                    await client.session.send_request(request, TypeAdapter(dict[str, Any]))
                assert refused.value.error.code == code, (mode, request.method)
                if code == -32021:
                    required = refused.value.error.data["requiredCapabilities"]
                    assert required == {"extensions": {"io.modelcontextprotocol/tasks": {}}}


async def _task_created_and_left(
    gateway: Gateway, key: str, arguments: dict[str, Any] | None = None
) -> CreateTaskResult:
    """Alice's refund (of 250 unless `arguments` say otherwise) becomes a task waiting for an approver;
    her client leaves it once created."""
    stop = anyio.CancelScope()  # entered around the call only: the client closes outside it
    tasks = Left(stop)
    async with gateway.client(gateway.token("alice"), mode="2026-07-28", extensions=[tasks]) as client:
        with stop:
            await client.call_tool("refund_order", arguments or refund(), meta={"writ/idempotencyKey": key})
    assert stop.cancelled_caught, "the call ended before it became a task"
    [created] = tasks.created
    return created


async def _send(gateway: Gateway, sub: str, request: Any, roles: str = "agent") -> dict[str, Any]:
    extension = Tasks(lambda created: None)
    async with gateway.client(
        gateway.token(sub, roles=roles), mode="2026-07-28", extensions=[extension]
    ) as c:
        return await c.session.send_request(request, TypeAdapter(dict[str, Any]))


def _approval_of(gateway: Gateway, task_id: str) -> Callable[[], dict[str, Any]]:
    """Reads the approval of a call waiting for one, now and later (an approver's view)."""
    headers = {"Authorization": f"Bearer {gateway.token('bob', roles='approver')}"}
    call = httpx2.get(f"{gateway.url}/api/calls/{task_id}", headers=headers, timeout=10).json()
    url = f"{gateway.url}/api/approvals/{call['approvalId']}"
    return lambda: httpx2.get(url, headers=headers, timeout=10).json()


async def test_the_requester_cancels_a_task_waiting_for_approval_and_it_can_no_longer_be_approved(
    sqlite_gateway: Gateway, backend: Backend
) -> None:
    created = await _task_created_and_left(sqlite_gateway, "task-5")
    params, approval_now = TaskParams(taskId=created.task_id), _approval_of(sqlite_gateway, created.task_id)

    answer = await _send(sqlite_gateway, "alice", CancelTaskRequest(params=params))
    task = await _send(sqlite_gateway, "alice", GetTaskRequest(params=params))

    assert answer["resultType"] == "complete"
    assert task["status"] == "cancelled" and "result" not in task
    approval = approval_now()
    assert (approval["status"], approval["decided_by"]) == ("rejected", "alice"), approval
    assert "tasks/cancel" in approval["reason"]
    headers = {"Authorization": f"Bearer {sqlite_gateway.token('bob', roles='approver')}"}
    late = httpx2.post(
        f"{sqlite_gateway.url}/api/approvals/{approval['approval_id']}/decision",
        json={"decision": "approve", "reason": "looks fine"},
        headers=headers,
        timeout=10,
    )
    assert late.status_code == 409, late.text
    assert backend.refunds("task-5") == []


async def test_cancelling_an_approved_task_does_not_undo_it_and_only_the_requester_can_withdraw_one(
    sqlite_gateway: Gateway, backend: Backend
) -> None:
    approved = await _task_created_and_left(sqlite_gateway, "task-6")
    approve(sqlite_gateway)(approved)
    await _send(sqlite_gateway, "alice", CancelTaskRequest(params=TaskParams(taskId=approved.task_id)))

    pending = await _task_created_and_left(sqlite_gateway, "task-7")
    answer = await _send(
        sqlite_gateway, "bob", CancelTaskRequest(params=TaskParams(taskId=pending.task_id)), roles="approver"
    )

    assert answer["resultType"] == "complete"
    assert _approval_of(sqlite_gateway, pending.task_id)()["status"] == "awaiting_approval"
    await eventually(lambda: backend.refunds("task-6"))
    task = await _send(sqlite_gateway, "alice", GetTaskRequest(params=TaskParams(taskId=approved.task_id)))
    assert task["status"] in ("working", "completed") and len(backend.refunds("task-6")) == 1


async def test_a_task_waiting_for_a_rule_with_a_message_says_it_and_one_without_says_none(
    tmp_path: Path, backend: Backend
) -> None:
    store_url = f"sqlite:///{tmp_path / 'writ.db'}"
    with inproc.writ(tmp_path, backend, store_url, extra_rules=[GOODWILL]) as g:
        told = await _task_created_and_left(g, "task-8", {**refund(20), "reason": "goodwill"})
        polled = await _send(g, "alice", GetTaskRequest(params=TaskParams(taskId=told.task_id)))
        silent = await _task_created_and_left(g, "task-9")  # the demo's approval rule has no message
    assert f"The policy says: {GOODWILL_SAYS}" in (told.status_message or "")
    assert polled["status"] == "working"
    assert f"The policy says: {GOODWILL_SAYS}" in polled["statusMessage"]
    assert "is approval_pending" in (silent.status_message or "")
    assert "policy says" not in (silent.status_message or "")
    assert backend.refunds("task-8") == backend.refunds("task-9") == []
