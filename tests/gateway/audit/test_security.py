"""The rate bound of `security.*` events: per key (type, kind, source, identity), the first refusal
after a quiet window is written on the next pass, the rest of a window make one event with their count,
and past `max_keys` keys new ones are counted under the source `other`. Counting writes nothing; a pass
whose write fails counts its refusals again."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

import anyio
import anyio.to_thread
import pytest

from gateway.audit.security import OTHER_SOURCE, SecurityEvents, SecurityRefusal, shown
from store.model import Unavailable
from store.security import SecurityNote
from tests.handoffs import hand_offs
from tests.store.builders import NOW


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> datetime:
        return self.now


class Log:
    """The store's `record_security`, in memory; `failing` makes the next write raise."""

    def __init__(self) -> None:
        self.notes: list[SecurityNote] = []
        self.failing = False

    def record_security(self, notes: Sequence[SecurityNote]) -> list[object]:
        if self.failing:
            self.failing = False
            raise Unavailable("the database is down")
        self.notes.extend(notes)
        return list(notes)


EXPIRED = SecurityRefusal("security.auth_failed", "expired", source="198.51.100.7")


def tick(events: SecurityEvents, *, flush_all: bool = False) -> int:
    return anyio.run(lambda: events.tick(flush_all=flush_all))


def test_a_flood_from_one_source_is_one_event_per_window_with_its_count() -> None:
    log, clock = Log(), Clock()
    events = SecurityEvents(log, clock, window_s=60)

    events.note(EXPIRED)
    assert log.notes == []  # counting writes nothing
    assert tick(events) == 1  # the first one after a quiet window: at once
    for second in range(1, 181):  # three minutes of 10 refusals a second, a pass every second
        clock.now = NOW + timedelta(seconds=second)
        for _ in range(10):
            events.note(EXPIRED)
        tick(events)

    # 1801 refusals in three minutes: four events (the first, then one a window), nothing lost.
    assert [n.count for n in log.notes] == [1, 600, 600, 600]
    assert [n.last_at - n.first_at for n in log.notes[1:]] == [timedelta(seconds=59)] * 3
    assert {(n.type, n.kind, n.source) for n in log.notes} == {
        ("security.auth_failed", "expired", "198.51.100.7")
    }
    clock.now = NOW + timedelta(seconds=200)
    events.note(EXPIRED)
    assert tick(events) == 0  # inside the window of the last event
    assert tick(events, flush_all=True) == 1  # on the way out, what is counted is written
    assert sum(n.count for n in log.notes) == 1802


def test_kinds_and_sources_are_counted_apart() -> None:
    log, clock = Log(), Clock()
    events = SecurityEvents(log, clock, window_s=60)
    bad = SecurityRefusal("security.auth_failed", "bad_signature", source="198.51.100.7")
    elsewhere = SecurityRefusal("security.auth_failed", "expired", source="192.0.2.1")

    for refusal in (EXPIRED, EXPIRED, bad, elsewhere, elsewhere, elsewhere):
        events.note(refusal)
    tick(events)

    assert sorted((n.kind, n.source, n.count) for n in log.notes) == [
        ("bad_signature", "198.51.100.7", 1),
        ("expired", "192.0.2.1", 3),
        ("expired", "198.51.100.7", 2),
    ]


def test_a_key_quiet_for_a_window_is_written_at_once_again() -> None:
    log, clock = Log(), Clock()
    events = SecurityEvents(log, clock, window_s=60)
    events.note(EXPIRED)
    tick(events)

    clock.now = NOW + timedelta(seconds=61)
    tick(events)  # forgets the quiet key
    clock.now = NOW + timedelta(seconds=62)
    events.note(EXPIRED)
    tick(events)

    assert [n.count for n in log.notes] == [1, 1]


def test_a_pass_with_nothing_counted_hands_nothing_to_a_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    log, clock = Log(), Clock()
    events = SecurityEvents(log, clock, window_s=60)
    handed = hand_offs(monkeypatch)
    assert tick(events) == 0
    assert handed == []

    events.note(EXPIRED)
    assert tick(events) == 1
    assert len(handed) == 1 and len(log.notes) == 1  # what was counted is written in a thread


def test_past_max_keys_new_sources_are_counted_as_other_without_detail() -> None:
    log, clock = Log(), Clock()
    events = SecurityEvents(log, clock, window_s=60, max_keys=3)

    for n in range(50):
        events.note(
            SecurityRefusal(
                "security.unknown_tool", "unknown_tool", tenant="acme", subject=f"s{n}", tool_name=f"t{n}"
            )
        )
    tick(events)

    assert len(log.notes) == 4
    other = [n for n in log.notes if n.source == OTHER_SOURCE]
    assert [(n.count, n.tenant, n.subject, n.tool_name) for n in other] == [(47, "acme", None, None)]
    assert sum(n.count for n in log.notes) == 50


def test_a_failed_write_counts_its_refusals_again() -> None:
    log, clock = Log(), Clock()
    events = SecurityEvents(log, clock, window_s=60)
    for _ in range(5):
        events.note(EXPIRED)

    log.failing = True
    with pytest.raises(Unavailable):
        tick(events)
    events.note(EXPIRED)
    clock.now = NOW + timedelta(seconds=1)
    tick(events)

    assert [(n.count, n.first_at) for n in log.notes] == [(6, NOW)]


def test_client_text_is_cut_and_made_printable() -> None:
    assert shown("rm\x00-rf\n") == "rm?-rf?"
    assert shown("x" * 500) == "x" * 128 + "..."
    assert shown("") is None and shown(None) is None


def test_every_refusal_is_counted_in_the_metric_before_the_rate_bound() -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from gateway.telemetry import Telemetry

    reader = InMemoryMetricReader()
    telemetry = Telemetry(None, MeterProvider(metric_readers=[reader]))
    events = SecurityEvents(Log(), lambda: NOW, window_s=60, counted=telemetry.security_refused)
    for _ in range(5):
        events.note(SecurityRefusal("security.edge_refused", "request_too_large", "10.0.0.9"))
    events.note(SecurityRefusal("security.auth_failed", "expired", "10.0.0.9"))
    assert len(events.due()) == 2  # the log keeps two events with counts; the metric counts six refusals
    data = reader.get_metrics_data()
    assert data is not None
    points = {
        (p.attributes["writ.security.type"], p.attributes["writ.security.kind"]): p.value
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == "writ.security.refusals"
        for p in m.data.data_points
        if p.attributes is not None
    }
    assert points == {
        ("security.edge_refused", "request_too_large"): 5,
        ("security.auth_failed", "expired"): 1,
    }
