"""The periodic checkpointer writes when the log moved `every_events` or `every_s` passed, never idle,
and its checkpoints anchor the log for `verify`."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from pydantic import ValidationError

from gateway.app import build_runtime
from gateway.audit import checkpointer as checkpointing
from gateway.audit.checkpointer import Checkpointer, announce
from gateway.audit.checkpoints import CheckpointSigner, parse, read_all, trusted_keys
from gateway.config import WritConfig
from gateway.errors import ConfigurationError
from gateway.telemetry import Telemetry
from store import Store
from store.commands import ClaimOutbox
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


def checkpointer(
    tmp_path: Path, store: Store, clock: Clock, every_events: int = 5, *, outbox: Store | None = None
) -> Checkpointer:
    return Checkpointer(
        outbox=outbox,
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


def test_a_tick_with_nothing_due_looks_from_the_loop_without_a_thread_or_a_file(
    tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    add_call(store, 1)
    worker = checkpointer(tmp_path, store, clock, every_events=5)
    assert anyio.run(worker.tick) is not None  # the first pass reads the directory and anchors seq 4
    handed: list[object] = []
    real = anyio.to_thread.run_sync

    async def counted(*args: Any, **kwargs: Any) -> Any:
        handed.append(args[0])
        return await real(*args, **kwargs)

    def no_file(path: object) -> object:
        raise AssertionError("an idle pass read the trusted keys")

    monkeypatch.setattr(anyio.to_thread, "run_sync", counted)
    monkeypatch.setattr(checkpointing, "trusted_keys", no_file)
    clock.now += timedelta(seconds=30)
    assert anyio.run(worker.tick) is None  # idle: nothing appended
    add_call(store, 2)
    clock.now += timedelta(seconds=1)
    assert anyio.run(worker.tick) is None  # 3 events, under every_events, before every_s
    assert handed == []
    assert worker.age_s() == 31.0  # the look keeps the age gauge current

    monkeypatch.undo()
    clock.now += timedelta(seconds=30)
    assert anyio.run(worker.tick) is not None  # every_s passed: the pass runs, in a thread
    assert written(tmp_path) == [4, 7]


def test_the_trusted_keys_are_read_again_only_when_their_file_changed(
    tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[object] = []
    real = checkpointing.trusted_keys

    def counted(path: Any) -> Any:
        reads.append(path)
        return real(path)

    monkeypatch.setattr(checkpointing, "trusted_keys", counted)
    clock = Clock()
    worker = checkpointer(tmp_path, store, clock, every_events=1)
    for n in range(3):
        add_call(store, n)
        assert worker.pass_once() is not None
    assert len(reads) == 1

    CheckpointSigner.load_or_create(tmp_path / "key.jwk", tmp_path / "trusted.jwks").rotate()
    add_call(store, 3)
    made = worker.pass_once()

    assert len(reads) == 2 and made is not None
    assert store.verify([c.anchor for c in read_all([tmp_path / "cp"], real(tmp_path / "trusted.jwks"))]).ok


def test_a_restarted_checkpointer_continues_from_the_newest_checkpoint(tmp_path: Path, store: Store) -> None:
    add_call(store, 1)
    checkpointer(tmp_path, store, Clock()).pass_once()

    again = checkpointer(tmp_path, store, Clock())
    assert again.pass_once() is None  # nothing new since the checkpoint it found
    add_call(store, 2)
    made = again.pass_once()

    assert made is not None and made.anchor.from_seq == 4


def test_with_a_webhook_each_checkpoint_is_queued_once_in_the_outbox_for_it(
    tmp_path: Path, store: Store
) -> None:
    clock = Clock()
    add_call(store, 1)
    worker = checkpointer(tmp_path, store, clock, outbox=store)
    first = worker.pass_once()
    add_call(store, 2)
    clock.now += timedelta(seconds=61)
    second = worker.pass_once()
    assert first is not None and second is not None

    queued = store.outbox_messages()
    assert sorted(m.payload["seq"] for m in queued) == [4, 7]
    assert {m.topic for m in queued} == {"audit.checkpoint"}
    keys = trusted_keys(tmp_path / "trusted.jwks")
    for message in queued:
        # What the receiver gets is the signed line itself: it verifies with the public keys alone.
        assert parse(message.payload["checkpoint"], keys, "webhook").anchor.seq == message.payload["seq"]
    assert not announce(store, first, clock.now)  # the same checkpoint again: queued once
    assert len(store.outbox_messages()) == 2
    # The approvals' webhook claims its own topic only, never a checkpoint.
    assert store.claim_outbox(ClaimOutbox(owner="w", now=clock.now, topics=("approval.required",))) == []
    assert len(store.claim_outbox(ClaimOutbox(owner="w", now=clock.now, topics=("audit.checkpoint",)))) == 2


def test_the_checkpoint_age_gauge_says_how_long_events_waited_unanchored(
    tmp_path: Path, store: Store
) -> None:
    reader = InMemoryMetricReader()
    telemetry = Telemetry(meter_provider=MeterProvider(metric_readers=[reader]))
    clock = Clock()
    worker = checkpointer(tmp_path, store, clock, every_events=100)
    telemetry.checkpoint_age(worker.age_s)

    assert gauge(reader) is None  # before the first pass nothing is known
    add_call(store, 1)
    worker.pass_once()  # anchors seq 4
    assert gauge(reader) == 0.0
    add_call(store, 2)
    clock.now += timedelta(seconds=30)
    worker.pass_once()  # not due: 3 events, 30 s
    assert gauge(reader) == 30.0
    clock.now += timedelta(seconds=31)
    worker.pass_once()  # due: every_s passed
    assert gauge(reader) == 0.0


def test_while_checkpoints_fail_the_age_grows_from_the_newest_one_found(
    tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    add_call(store, 1)
    checkpointer(tmp_path, store, clock).pass_once()
    add_call(store, 2)
    clock.now += timedelta(seconds=20)

    def full_disk(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("gateway.audit.checkpointer.write_checkpoint", full_disk)
    restarted = checkpointer(tmp_path, store, clock)
    with pytest.raises(OSError):
        restarted.pass_once()
    assert restarted.age_s() == 20.0
    clock.now += timedelta(seconds=40)
    assert restarted.age_s() == 60.0


def gauge(reader: InMemoryMetricReader) -> float | None:
    data = reader.get_metrics_data()
    points = [
        point.value
        for resource in (data.resource_metrics if data else [])
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == "writ.audit.checkpoint.age"
        for point in metric.data.data_points
    ]
    assert len(points) <= 1
    return points[0] if points else None


def test_a_checkpoint_webhook_without_its_secret_is_refused_at_start_naming_the_variable(
    tmp_path: Path,
) -> None:
    checkpoints = {
        "enabled": True,
        "directory": str(tmp_path / "cp"),
        "key_file": str(tmp_path / "key.jwk"),
        "trusted_keys": str(tmp_path / "trusted.jwks"),
        "webhook": {"url": "https://audit.example/writ", "secret_env": "WRIT_CHECKPOINT_SECRET"},
    }
    config = WritConfig.model_validate(
        {
            "store": {"url": f"sqlite:///{tmp_path / 'writ.db'}"},
            "privacy": {"salt_file": str(tmp_path / "redaction.salt")},
            "audit": {"checkpoints": checkpoints},
        }
    )

    with pytest.raises(ConfigurationError) as refused:
        build_runtime(config, environ={"WRIT_WEBHOOK_SECRET": "the approvals' one"})
    assert (
        str(refused.value) == "audit.checkpoints.webhook: set the signing secret in $WRIT_CHECKPOINT_SECRET"
    )
    with pytest.raises(ValidationError, match="must be an absolute http"):
        WritConfig.model_validate({"audit": {"checkpoints": {"webhook": {"url": "audit.example/writ"}}}})
