"""The periodic checkpointer writes when the log moved `every_events` or `every_s` passed, never idle,
and its checkpoints anchor the log for `verify`."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from gateway.audit.checkpointer import Checkpointer
from gateway.audit.checkpoints import CheckpointSigner, read_all, trusted_keys
from store import Store
from tests.store.builders import NOW, call_request, outcome


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store.open(f"sqlite:///{tmp_path / 'writ.db'}") as opened:
        opened.migrate()
        yield opened


def add_call(store: Store, n: int) -> None:
    store.admit(call_request(tool_call_id=f"tc-{n}", idempotency_key=f"k{n}"))
    store.record_outcome(outcome(f"tc-{n}", "completed", now=NOW))


def checkpointer(tmp_path: Path, store: Store, clock: Clock, every_events: int = 5) -> Checkpointer:
    return Checkpointer(
        log=store,
        signer=CheckpointSigner.load_or_create(tmp_path / "key.jwk", tmp_path / "trusted.jwks"),
        directory=tmp_path / "cp",
        trusted=tmp_path / "trusted.jwks",
        clock=clock,
        every_events=every_events,
        every_s=60,
    )


def written(tmp_path: Path) -> list[int]:
    if not (tmp_path / "cp").is_dir():
        return []
    return [c.anchor.seq for c in read_all([tmp_path / "cp"], trusted_keys(tmp_path / "trusted.jwks"))]


def test_nothing_is_written_for_an_empty_or_idle_log(tmp_path: Path, store: Store) -> None:
    clock = Clock()
    worker = checkpointer(tmp_path, store, clock)
    assert worker.pass_once() is None
    add_call(store, 1)  # 4 events
    assert worker.pass_once() is not None  # the first pass anchors what is there
    clock.now += timedelta(hours=1)

    assert worker.pass_once() is None  # an hour passed, but nothing was appended
    assert written(tmp_path) == [4]


def test_a_checkpoint_is_due_after_every_events_or_every_s(tmp_path: Path, store: Store) -> None:
    clock = Clock()
    add_call(store, 1)
    worker = checkpointer(tmp_path, store, clock, every_events=5)
    worker.pass_once()  # seq 4
    add_call(store, 2)  # 3 more: under every_events, before every_s
    assert worker.pass_once() is None
    add_call(store, 3)  # 6 since the last: due
    assert worker.pass_once() is not None
    add_call(store, 4)
    clock.now += timedelta(seconds=61)  # fewer events, but every_s passed
    assert worker.pass_once() is not None

    assert written(tmp_path) == [4, 10, 13]
    anchors = [c.anchor for c in read_all([tmp_path / "cp"], trusted_keys(tmp_path / "trusted.jwks"))]
    assert [(a.from_seq, len(a.digests)) for a in anchors] == [(0, 4), (4, 6), (10, 3)]
    assert store.verify(anchors).ok


def test_a_restarted_checkpointer_continues_from_the_newest_checkpoint(tmp_path: Path, store: Store) -> None:
    add_call(store, 1)
    checkpointer(tmp_path, store, Clock()).pass_once()

    again = checkpointer(tmp_path, store, Clock())
    assert again.pass_once() is None  # nothing new since the checkpoint it found
    add_call(store, 2)
    made = again.pass_once()

    assert made is not None and made.anchor.from_seq == 4
