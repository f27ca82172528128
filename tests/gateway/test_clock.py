"""Business time by the database server's clock, which every replica of a shared store reads."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from gateway.clock import SharedClock
from store.model import Unavailable

REAL = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
AHEAD = timedelta(seconds=20)


class Host:
    """A host's wall clock, `AHEAD` of real time, that moves on by `step` at every reading."""

    def __init__(self, step: timedelta = timedelta(milliseconds=1)) -> None:
        self.real, self.step = REAL, step

    def __call__(self) -> datetime:
        self.real += self.step
        return self.real + AHEAD

    def monotonic(self) -> float:
        """The host's monotonic clock: real time elapsed, whatever its wall clock reads."""
        return (self.real - REAL).total_seconds()


def server(host: Host) -> Callable[[], datetime]:
    """The database's clock: real time."""
    return lambda: host.real


def test_a_host_clock_ahead_of_the_database_keeps_the_databases_time() -> None:
    host = Host()
    clock = SharedClock(host, host.monotonic)
    assert clock() - host.real == AHEAD  # before any measurement: the host's own clock

    measured = clock.measure(server(host))

    assert measured is not None
    assert abs(measured.offset + AHEAD) <= measured.round_trip / 2
    assert abs(clock() - host.real) <= measured.round_trip / 2
    assert "20.000 s ahead of the database server's" in measured.text()


def test_of_several_round_trips_the_shortest_is_kept() -> None:
    host = Host(step=timedelta(0))
    legs = iter([timedelta(milliseconds=ms) for ms in (5, 300, 1)])  # each way, one trip after another

    def now() -> datetime:
        leg = next(legs)
        host.real += leg  # there
        read = host.real
        host.real += leg  # and back
        return read

    clock = SharedClock(host, host.monotonic)
    measured = clock.measure(now, samples=3)

    assert measured is not None
    assert measured.round_trip == timedelta(milliseconds=2)
    assert measured.offset == -AHEAD  # a symmetric trip: exact


def test_with_no_server_clock_the_host_clock_is_kept() -> None:
    host = Host()
    clock = SharedClock(host, host.monotonic)
    assert clock.measure(lambda: None) is None
    assert clock.offset == timedelta(0)
    assert clock() - host.real == AHEAD


def test_a_database_out_of_reach_raises_and_keeps_the_offset_measured_last() -> None:
    host = Host()
    clock = SharedClock(host, host.monotonic)
    clock.measure(server(host))
    before = clock.offset

    def down() -> datetime:
        raise Unavailable("the database is down")

    with pytest.raises(Unavailable):
        clock.measure(down)
    assert clock.offset == before


def test_an_offset_over_a_second_is_warned_of_once_and_its_end_told(caplog: pytest.LogCaptureFixture) -> None:
    host = Host()
    clock = SharedClock(host, host.monotonic)
    with caplog.at_level(logging.INFO, logger="gateway.clock"):
        clock.measure(server(host))
        clock.measure(server(host))
        host.real += AHEAD  # NTP steps the host's clock right: its readings are real time again
        clock._base = lambda: host.real  # type: ignore[method-assign]
        clock.measure(lambda: host.real)

    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert len([level for level, _ in said if level == "WARNING"]) == 1, said
    assert "20.0" in said[0][1] and "ahead of the database server's" in said[0][1]
    assert said[-1][0] == "INFO" and "agrees with the database's again" in said[-1][1]


def test_a_host_clock_stepped_after_the_measurement_does_not_move_business_time() -> None:
    host = Host()
    clock = SharedClock(host, host.monotonic)
    clock.measure(server(host))
    stepped = host.real + timedelta(minutes=5)  # an operator or NTP steps the wall clock 5 minutes ahead
    clock._base = lambda: stepped + AHEAD  # type: ignore[method-assign]
    host.real += timedelta(seconds=10)  # and 10 s go by before the next measurement

    assert abs(clock() - host.real) <= timedelta(milliseconds=2)
