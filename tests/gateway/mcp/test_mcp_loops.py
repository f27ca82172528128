"""Loop detection through an MCP client: a looping agent is stopped by Writ, not by its own restraint.

In-process (`inproc.py`): issue 13 saw 200 identical failing calls all sent to the backend, and ten
refunds differing by one cent all made.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from string import Template
from typing import Any

import pytest
import yaml

from policy import PolicyConfig
from tests.e2e.harness import REPO
from tests.gateway.mcp.inproc import Backend, Writ, acme, writ

N = 5
# Thirty days, aligned to the epoch: a case crossing a window's end (and so counting afresh) is a
# chance of one in hundreds of thousands, not one in hundreds as an hour would be.
WINDOW = "30d"
LOOPS = [
    {"id": "same-call-repeated", "threshold": N, "window": WINDOW},
    {
        "id": "refunds-differing-in-amount",
        "tools": ["refund_order"],
        "ignore": ["amount", "reason"],
        "threshold": N,
        "window": WINDOW,
    },
    {"id": "same-failure", "tools": ["refund_order"], "count": "failures", "threshold": N, "window": WINDOW},
]


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    with acme(tmp_path_factory.mktemp("acme")) as b:
        yield b


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, backend: Backend) -> Iterator[Writ]:
    workdir: Path = tmp_path_factory.mktemp("writ")
    # The rate limit only slows a loop (20 calls a second by default): off here, so 200 calls are quick.
    off = {"rate_limits": {"enabled": False}}
    with writ(workdir, backend, f"sqlite:///{workdir / 'writ.db'}", loops=LOOPS, overrides=off) as g:
        yield g


def _subject() -> str:
    return f"looping-agent-{uuid.uuid4().hex[:8]}"


async def _calls(
    gateway: Writ, subject: str, tool: str, arguments: list[dict[str, Any]]
) -> list[tuple[str, dict[str, Any]]]:
    """Each call's recorded status and the structured answer the client heard."""
    heard = []
    async with gateway.client(gateway.token(subject)) as client:
        for args in arguments:
            result = await client.call_tool(tool, args)
            tool_call_id = (result.meta or {})["writ/toolCallId"]
            call = gateway.runtime.store.get_call(tool_call_id)
            assert call is not None
            heard.append((call.status, {"toolCallId": tool_call_id, **(result.structured_content or {})}))
    return heard


def _loops_detected(gateway: Writ, subject: str) -> list[dict[str, Any]]:
    with gateway.store() as store:
        return [
            e.payload
            for e in store.events()
            if e.type == "loop.detected"
            and (c := store.get_call(e.tool_call_id or ""))
            and c.subject == subject
        ]


def _assert_told_to_stop(body: dict[str, Any], rule: str) -> None:
    assert body["status"] == "denied"
    assert body["reason"] == "loop_detected"
    assert body["loop"]["rule"] == rule
    assert body["loop"]["threshold"] == N
    assert "do not retry" in body["next"] and "Report to your user" in body["next"]


@pytest.mark.anyio
async def test_two_hundred_identical_failing_calls_reach_the_backend_n_times(gateway: Writ) -> None:
    subject = _subject()
    missing = {"order_id": "no-such-order", "amount": 5, "currency": "EUR", "reason": "damaged"}

    heard = await _calls(gateway, subject, "refund_order", [missing] * 200)

    assert [status for status, _ in heard] == ["failed"] * N + ["denied"] * (200 - N)
    for _, body in heard[N:]:
        _assert_told_to_stop(body, "same-call-repeated")
    (detected,) = _loops_detected(gateway, subject)
    assert detected["kind"] == "repeated_action"
    assert detected["tool_call_ids"] == [body["toolCallId"] for _, body in heard[:N]]
    assert gateway.event_types(heard[N][1]["toolCallId"]) == [
        "tool_call.requested",
        "loop.detected",
        "tool_call.denied",
    ]
    with gateway.store() as store:
        sent = [e for e in store.events() if e.type == "tool_call.dispatching"]
        ours = {body["toolCallId"] for _, body in heard}
        assert len([e for e in sent if e.tool_call_id in ours]) == N


@pytest.mark.anyio
async def test_two_hundred_calls_failing_the_same_way_are_stopped_whatever_their_arguments(
    gateway: Writ,
) -> None:
    subject = _subject()
    missing = [
        {"order_id": f"no-such-order-{n}", "amount": 5, "currency": "EUR", "reason": "damaged"}
        for n in range(200)
    ]

    heard = await _calls(gateway, subject, "refund_order", missing)

    assert [status for status, _ in heard] == ["failed"] * N + ["denied"] * (200 - N)
    for _, body in heard[N:]:
        _assert_told_to_stop(body, "same-failure")
    (detected,) = _loops_detected(gateway, subject)
    assert (detected["kind"], detected["error"]) == ("repeated_failure", "http_404")
    assert detected["tool_call_ids"] == [body["toolCallId"] for _, body in heard[:N]]


@pytest.mark.anyio
async def test_refunds_differing_by_one_cent_and_reworded_are_caught_by_a_rule_naming_amount_and_reason(
    gateway: Writ, backend: Backend
) -> None:
    subject = _subject()
    refunds = [
        {
            "order_id": "1003",
            "amount": round(1 + n / 100, 2),
            "currency": "USD",
            "reason": f"goodwill, try {n}",
        }
        for n in range(10)
    ]

    heard = await _calls(gateway, subject, "refund_order", refunds)

    assert [status for status, _ in heard] == ["completed"] * N + ["denied"] * (10 - N)
    for _, body in heard[N:]:
        _assert_told_to_stop(body, "refunds-differing-in-amount")
    (detected,) = _loops_detected(gateway, subject)
    assert detected["kind"] == "near_identical"

    # Another principal making the same refunds is not affected, nor is this one refunding another order.
    others = await _calls(gateway, _subject(), "refund_order", refunds[:1])
    assert [status for status, _ in others] == ["completed"]
    other_order = await _calls(
        gateway, subject, "refund_order", [{**refunds[0], "order_id": "1002", "currency": "EUR"}]
    )
    assert [status for status, _ in other_order] == ["completed"]


def test_the_demo_turns_loop_detection_on() -> None:
    template = Template((REPO / "demo" / "demo.yaml").read_text())
    config = yaml.safe_load(template.safe_substitute(gateway_port=1, backend_port=2, state_dir="/tmp"))

    loops = {rule.id: rule for rule in PolicyConfig.model_validate(config["policy"]).loops}

    assert loops["same-call-repeated"].kind == "repeated_action"
    refunds = loops["refunds-differing-in-amount"]
    # A free-text field left out too: an agent rewording its reason is the same loop.
    assert (refunds.kind, refunds.ignore, refunds.tools) == (
        "near_identical",
        ["amount", "reason"],
        ["refund_order"],
    )
    assert loops["same-failure-repeated"].kind == "repeated_failure"


PAUSING = [
    {
        "id": "pause-on-lookups",
        "tools": ["lookup_order"],
        "threshold": 3,
        "window": WINDOW,
        "on_detect": "pause_run",
    }
]


@pytest.mark.anyio
async def test_a_pausing_rule_stops_the_looping_run_until_a_person_resumes_it(
    tmp_path: Path, backend: Backend
) -> None:
    off = {"rate_limits": {"enabled": False}}
    with writ(tmp_path, backend, f"sqlite:///{tmp_path / 'writ.db'}", loops=PAUSING, overrides=off) as g:
        store = g.runtime.store
        token = g.token(_subject())
        lookup = {"order_id": "1001"}
        async with g.client(token, mode="legacy") as client:  # a session: one run Writ owns
            pending = await client.call_tool(
                "refund_order", {"order_id": "1002", "amount": 150, "currency": "EUR", "reason": "damaged"}
            )
            run_id = (pending.meta or {})["writ/runId"]
            answered = [await client.call_tool("lookup_order", lookup) for _ in range(3)]
            looping = await client.call_tool("lookup_order", lookup)
            after = await client.call_tool("lookup_order", {"order_id": "1002"})
            resumed = g.cli("runs", "resume", run_id, "--break-glass", "--reason", "agent fixed")
            again = await client.call_tool("lookup_order", {"order_id": "1002"})
        async with g.client(token) as stateless:  # no runId, no session: in no run
            alone = [await stateless.call_tool("lookup_order", {"order_id": "1003"}) for _ in range(4)]

        assert all((r.structured_content or {}).get("status") != "denied" for r in answered)
        body = looping.structured_content or {}
        assert (body["reason"], body["loop"]["runStopped"]) == ("loop_detected", run_id)
        assert f"Writ has stopped run {run_id}" in body["next"]
        assert (after.structured_content or {})["reason"] == "run_stopped"
        assert json.loads(resumed.stdout)["status"] == "active"
        assert (again.structured_content or {}).get("status") != "denied"
        run = store.get_run(run_id)
        assert run is not None and run.status == "active"
        stops = [e for e in store.events(run_id=run_id) if e.type == "run.stopped"]
        assert [(e.payload["stopped_by"], "pause-on-lookups" in e.payload["reason"]) for e in stops] == [
            ("writ", True)
        ]
        approval_id = (pending.structured_content or {})["approvalId"]
        approval = store.get_approval(approval_id)
        assert approval is not None and (approval.status, approval.decided_by) == ("rejected", "writ")
        assert [(r.structured_content or {}).get("reason") for r in alone][3] == "loop_detected"
        assert "runStopped" not in (alone[3].structured_content or {})["loop"]
        assert len([e for e in store.events() if e.type == "run.stopped"]) == 1


def test_the_demo_turns_a_budget_on() -> None:
    template = Template((REPO / "demo" / "demo.yaml").read_text())
    config = yaml.safe_load(template.safe_substitute(gateway_port=1, backend_port=2, state_dir="/tmp"))

    (budget,) = PolicyConfig.model_validate(config["policy"]).budgets

    assert (budget.id, budget.roles, budget.window_s, budget.on_exceed) == (
        "agent-calls-per-hour",
        ["agent"],
        3600,
        "deny",
    )
