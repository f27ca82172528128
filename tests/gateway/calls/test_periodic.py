"""The loop every background worker runs: a failed pass does not stop it, a wake hurries it."""

from __future__ import annotations

import logging

import anyio
import pytest

from gateway.calls.periodic import Wake, run_periodically


@pytest.mark.anyio
async def test_a_failed_pass_is_logged_and_the_next_pass_runs(caplog: pytest.LogCaptureFixture) -> None:
    passes: list[int] = []
    done = anyio.Event()

    async def tick() -> None:
        passes.append(len(passes))
        if len(passes) == 1:
            raise RuntimeError("the store is down")
        done.set()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            group.start_soon(lambda: run_periodically(tick, interval_s=0.01, failure="test pass failed"))
            await done.wait()
            group.cancel_scope.cancel()

    assert passes == [0, 1]
    failed = [r for r in caplog.records if r.message == "test pass failed"]
    assert len(failed) == 1 and failed[0].levelno == logging.ERROR and failed[0].exc_info is not None


@pytest.mark.anyio
async def test_a_failure_that_recurs_is_said_whole_once_then_in_a_line_and_its_end_is_said(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A database outage of seconds: every worker's every pass raised, each logged with its traceback.
    passes: list[int] = []
    done = anyio.Event()
    clock = [0.0]

    async def tick() -> None:
        passes.append(len(passes))
        clock[0] += 10.0  # ten seconds a pass: passes 1 to 7 of the outage span its first minute
        if len(passes) <= 8:
            raise RuntimeError("the store is down")
        if len(passes) == 9:
            raise ValueError("another failure")
        done.set()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            group.start_soon(
                lambda: run_periodically(
                    tick, interval_s=0, failure="test pass failed", clock=lambda: clock[0]
                )
            )
            await done.wait()
            group.cancel_scope.cancel()

    said = [(r.levelno, r.getMessage(), r.exc_info is not None) for r in caplog.records]
    assert said == [
        (logging.ERROR, "test pass failed", True),  # the outage, whole, when it starts
        (
            logging.ERROR,
            "test pass failed again (7 passes failed so far): RuntimeError: the store is down",
            False,
        ),
        (logging.ERROR, "test pass failed", True),  # another failure is said whole
        (logging.WARNING, "test pass failed: passes run again, after 9 failed", False),
    ]


@pytest.mark.anyio
async def test_a_wake_runs_the_next_pass_before_the_interval_is_over() -> None:
    wake = Wake()
    passes = 0
    second = anyio.Event()

    async def tick() -> None:
        nonlocal passes
        passes += 1
        if passes == 2:
            second.set()

    with anyio.fail_after(5):  # the interval is an hour: only the wake can bring the second pass
        async with anyio.create_task_group() as group:
            group.start_soon(lambda: run_periodically(tick, interval_s=3600, failure="x", wake=wake))
            while passes < 1:
                await anyio.sleep(0.01)
            wake()
            await second.wait()
            group.cancel_scope.cancel()

    assert passes == 2


@pytest.mark.anyio
async def test_a_wake_during_a_pass_hurries_the_pass_after_it() -> None:
    wake = Wake()
    passes = 0
    second = anyio.Event()

    async def tick() -> None:
        nonlocal passes
        passes += 1
        if passes == 1:
            wake()  # a decision made while the pass ran: the next pass must not wait the interval
        else:
            second.set()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            group.start_soon(lambda: run_periodically(tick, interval_s=3600, failure="x", wake=wake))
            await second.wait()
            group.cancel_scope.cancel()
