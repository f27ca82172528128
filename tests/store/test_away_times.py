"""Which calls away at their backends the group writer may wait for, on an injected clock (store.coming).

A call away is waited for while it is due back within the writer's bound by its backend's usual
answer time, and until it turns late; a backend of unknown time, or slower than the bound, is not
waited for; a call whose own write is queued never is.
"""

from __future__ import annotations

import math

import pytest

from store.coming import Arrivals, AwayTimes, Coming


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def arrivals(clock: Clock) -> Arrivals:
    return Arrivals(clock)


def test_a_backends_usual_time_starts_at_its_first_answer_and_moves_an_eighth_toward_each_next() -> None:
    times = AwayTimes()
    assert times.due("b", 0.0) is None
    times.observe("b", 0.08)  # mean 0.08, spread 0.04
    due = times.due("b", 10.0)
    assert due is not None
    assert due.back_at == pytest.approx(10.08)
    assert due.late_at == pytest.approx(10.08 + 2 * 0.04)
    times.observe("b", 0.16)  # mean += (0.16 - 0.08) / 8; spread += (0.08 - 0.04) / 4
    due = times.due("b", 10.0)
    assert due is not None
    assert due.back_at == pytest.approx(10.09)
    assert due.late_at == pytest.approx(10.09 + 2 * 0.05)


def test_a_backend_whose_times_never_vary_still_allows_a_quarter_of_its_time_before_late() -> None:
    times = AwayTimes()
    for _ in range(50):
        times.observe("b", 0.04)
    due = times.due("b", 0.0)
    assert due is not None
    assert due.late_at - due.back_at == pytest.approx(0.01, abs=1e-4)


def test_a_call_away_at_a_backend_of_unknown_time_is_not_awaited(arrivals: Arrivals) -> None:
    with Coming(arrivals, 1) as call, call.away_now("b"):
        assert arrivals.awaitable(arrivals.clock(), arrivals.clock() + 0.025) == set()
        assert not arrivals.away and not arrivals.coming


def test_a_call_due_back_within_the_bound_is_awaited_until_it_turns_late(
    arrivals: Arrivals, clock: Clock
) -> None:
    arrivals.times.observe("b", 0.02)  # back 20 ms after it leaves, late 40 ms after
    with Coming(arrivals, 1) as call:
        assert arrivals.awaitable(clock.now, clock.now + 0.025) == {call}  # coming
        with call.away_now("b"):
            left = clock.now
            assert arrivals.awaitable(clock.now, clock.now + 0.025) == {call}  # due back at +20 ms
            assert arrivals.awaitable(clock.now, clock.now + 0.015) == set()  # not within this bound
            assert arrivals.late_at({call}) == pytest.approx(left + 0.04)
            clock.now = left + 0.039
            assert arrivals.awaitable(clock.now, clock.now + 0.025) == {call}  # overdue, not late yet
            clock.now = left + 0.04
            assert arrivals.awaitable(clock.now, clock.now + 0.025) == set()  # late: given up
            clock.now = left + 0.1
        assert arrivals.awaitable(clock.now, clock.now + 0.025) == {call}  # back, on its way to commit
        assert arrivals.late_at({call}) == math.inf
    assert arrivals.awaitable(clock.now, clock.now + 0.025) == set()
    assert not arrivals.away


def test_a_backend_turned_slow_is_not_waited_for_from_its_first_slow_answer_on(
    arrivals: Arrivals, clock: Clock
) -> None:
    for _ in range(20):
        arrivals.times.observe("b", 0.01)
    with Coming(arrivals, 1) as call:
        with call.away_now("b"):
            clock.now += 1.0  # far beyond its usual 10 ms
        with call.away_now("b"):  # the mean is now about 134 ms: not due within 25 ms
            assert arrivals.awaitable(clock.now, clock.now + 0.025) == set()


def test_a_call_with_its_own_write_queued_is_not_awaited_even_when_away(
    arrivals: Arrivals, clock: Clock
) -> None:
    arrivals.times.observe("b", 0.02)
    with Coming(arrivals, 2) as call:
        call.submitted(lambda: None)
        with call.away_now("b"):
            assert arrivals.awaitable(clock.now, clock.now + 0.025) == set()
        call.answered()
        with call.away_now("b"):
            assert arrivals.awaitable(clock.now, clock.now + 0.025) == {call}  # one commit left
        call.submitted(lambda: None)
        with call.away_now("b"):
            assert arrivals.awaitable(clock.now, clock.now + 0.025) == set()  # none left


def test_a_call_that_ends_while_away_wakes_the_waiting_writer(
    arrivals: Arrivals, monkeypatch: pytest.MonkeyPatch
) -> None:
    arrivals.times.observe("b", 0.02)
    woken: list[bool] = []
    monkeypatch.setattr(arrivals.condition, "notify_all", lambda: woken.append(True))
    call = Coming(arrivals, 1).__enter__()
    with call.away_now("b"):
        assert arrivals.away
        arrivals.watched = True  # the writer waits for it
        call.__exit__(None, None, None)  # it ends there (cancelled): nothing left to commit
        assert woken == [True]
        assert not arrivals.away
