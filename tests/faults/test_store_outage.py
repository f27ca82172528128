"""The database goes away under a running `writ serve` (PostgreSQL behind a relay whose plug is pulled).

Before a call is recorded, the client hears a clear error and nothing is sent. After the backend acted
and before its outcome is recorded, the client hears `result_unknown`, never a result Writ has no
record of; once the database is back, the call is recovered and reconciled to the backend's truth.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.shared.exceptions import MCPError

from gateway.calls.faults import STOP_ENV
from store import Store
from tests.e2e.harness import Backend, mcp_client
from tests.faults.campaign import ARGS, stopped
from tests.faults.plug import plugged, through
from tests.faults.test_replicas import Replica, replica, wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.e2e, pytest.mark.postgres]


async def refund(writ: Replica, key: str) -> Any:
    async with mcp_client(writ.url, writ.token, mode="2026-07-28") as client:
        return await client.call_tool("refund_order", ARGS, meta={"writ/idempotencyKey": key})


async def test_with_the_database_gone_a_call_is_refused_clearly_and_nothing_is_sent(
    tmp_path: Path, backend: Backend, pg_url: str
) -> None:
    with plugged(5432) as plug, replica(tmp_path, "a", backend, through(plug, pg_url)) as writ:
        assert (await refund(writ, "warm-up")).meta["writ/status"] == "completed"

        plug.pull()
        async with mcp_client(writ.url, writ.token, mode="2026-07-28") as client:
            with pytest.raises(MCPError) as refused:
                await client.call_tool("refund_order", ARGS, meta={"writ/idempotencyKey": "while-down"})
            assert "store is unavailable" in refused.value.error.message
            assert "nothing with an effect was sent" in refused.value.error.message
            with pytest.raises(MCPError, match="state cannot be read now"):
                await client.call_tool("writ_call_status", {"toolCallId": "tc-any"})
        assert backend.refunds("while-down") == []

        plug.plug_in()  # the same key again, once the database is back: one effect
        assert (await refund(writ, "while-down")).meta["writ/status"] == "completed"
        assert len(backend.refunds("while-down")) == 1
        assert writ.process.poll() is None


async def test_an_outcome_the_database_cannot_take_is_answered_unknown_then_reconciled(
    tmp_path: Path, backend: Backend, pg_url: str
) -> None:
    # Frozen right after the backend answered, before the outcome is recorded; the database goes away
    # meanwhile, so the outcome in hand can never be made durable by this process.
    stop_after_effect = {STOP_ENV: "after_execute:1"}
    with (
        plugged(5432) as plug,
        replica(tmp_path, "a", backend, through(plug, pg_url), **stop_after_effect) as writ,
        Store.open(pg_url) as store,
    ):
        answers: list[Any] = []

        async def call() -> None:
            answers.append(await refund(writ, "outcome-lost"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            with anyio.fail_after(20):
                while not (backend.refunds("outcome-lost") and stopped(writ.process.pid)):
                    await anyio.sleep(0.05)
            plug.pull()
            os.kill(writ.process.pid, signal.SIGCONT)
        [answer] = answers
        assert answer.structured_content["status"] == "result_unknown"
        assert answer.structured_content["reconciliation"] == "pending"
        assert "could not be recorded" in answer.content[0].text
        tool_call_id = answer.meta["writ/toolCallId"]
        assert store.get_call(tool_call_id).status == "dispatching"  # nothing recorded it yet

        plug.plug_in()  # the lease runs out; the worker marks it unknown and reconciliation looks
        settled = await wait_for(store, "outcome-lost", lambda c: c.status in ("completed", "failed"))
        events = [e.type for e in store.events(tool_call_id=tool_call_id)]
        assert (settled.status, settled.verification_status) == ("completed", "confirmed_success")
        assert "tool_call.result_unknown" in events and "reconciliation.resolved" in events
        assert (await refund(writ, "outcome-lost")).meta["writ/status"] == "completed"
        assert len(backend.refunds("outcome-lost")) == 1
