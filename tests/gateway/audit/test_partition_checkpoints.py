"""A checkpoint of a partitioned log signs every partition's head; verify holds each chain to it, so a
partition deleted whole (events and head) or rewritten and re-sealed is caught and named."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import delete, select, update

from gateway.audit.checkpoints import CheckpointSigner, read_all, trusted_keys, write_checkpoint
from store import Anchor, Store
from store.events import GENESIS_HASH, compute_hash, json_for
from store.partitions import Partitioning
from store.schema import events, log_head
from store.security import SecurityNote
from tests.store.builders import NOW, call_request

AT = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store.open(f"sqlite:///{tmp_path}/writ.db", partitioning=Partitioning("tenant")) as opened:
        opened.migrate()
        opened.record_security(
            [
                SecurityNote(
                    type="security.auth_failed",
                    kind="expired",
                    count=1,
                    first_at=NOW,
                    last_at=NOW,
                    window_s=60,
                )
            ]
        )
        opened.admit(call_request(tool_call_id="tc-a", idempotency_key="a"))
        opened.admit(call_request(tool_call_id="tc-g", idempotency_key="g", tenant="globex", run_id="run-g"))
        yield opened


def checkpointed(store: Store, tmp_path: Path) -> list[Anchor]:
    signer = CheckpointSigner.load_or_create(tmp_path / "key.jwk", tmp_path / "trusted.jwks")
    keys = trusted_keys(tmp_path / "trusted.jwks")
    made, _ = write_checkpoint(store, signer, tmp_path / "checkpoints", keys, AT)
    assert {h[0] for h in made.anchor.heads} == {"t:acme", "t:globex"}
    return [c.anchor for c in read_all([tmp_path / "checkpoints"], keys)]


def test_a_checkpoint_signs_every_partitions_head_and_an_intact_log_verifies(
    store: Store, tmp_path: Path
) -> None:
    anchors = checkpointed(store, tmp_path)
    line = next((tmp_path / "checkpoints").glob("*.jws")).read_text().split(".")[1]
    assert "heads" in json.loads(__import__("base64").urlsafe_b64decode(line + "==").decode())

    report = store.verify(anchors)
    assert report.ok, report


def test_a_partition_deleted_whole_is_caught_by_the_checkpoint(store: Store, tmp_path: Path) -> None:
    anchors = checkpointed(store, tmp_path)
    with store.engine.begin() as conn:  # the chain alone cannot see it: no events, no head
        conn.execute(delete(events).where(events.c.partition == "t:globex"))
        conn.execute(delete(log_head).where(log_head.c.partition == "t:globex"))
    assert store.verify().chain_ok

    report = store.verify(anchors)
    assert (report.chain_ok, report.partition, report.problem, report.first_bad_seq) == (
        False,
        "t:globex",
        "truncated",
        1,
    )


def test_a_partition_rewritten_and_resealed_is_caught_by_the_checkpoint(store: Store, tmp_path: Path) -> None:
    anchors = checkpointed(store, tmp_path)
    with store.engine.begin() as conn:  # edit acme's first event, re-seal its chain and move its head
        rows = [
            dict(r._mapping)
            for r in conn.execute(
                select(events).where(events.c.partition == "t:acme").order_by(events.c.pseq)
            )
        ]
        prev = GENESIS_HASH
        for row in rows:
            envelope = {**row, "payload": json.loads(row["payload"]), "prev_hash": prev}
            if row["pseq"] == 1:
                envelope["payload"]["tampered"] = True
            envelope["hash"] = compute_hash(envelope)
            payload = json_for(envelope["schema_version"])(envelope["payload"])
            conn.execute(
                update(events)
                .where(events.c.seq == row["seq"])
                .values(payload=payload, prev_hash=prev, hash=envelope["hash"])
            )
            prev = envelope["hash"]
        conn.execute(update(log_head).where(log_head.c.partition == "t:acme").values(last_hash=prev))
    assert store.verify().chain_ok

    report = store.verify(anchors)
    assert (report.chain_ok, report.partition, report.problem) == (False, "t:acme", "rewritten")


def test_the_periodic_checkpointer_counts_the_events_of_every_partition(store: Store, tmp_path: Path) -> None:
    from gateway.audit.checkpointer import Checkpointer

    worker = Checkpointer(
        log=store,
        signer=CheckpointSigner.load_or_create(tmp_path / "key.jwk", tmp_path / "trusted.jwks"),
        directory=tmp_path / "cp",
        trusted=tmp_path / "trusted.jwks",
        clock=lambda: AT,
        every_events=3,
        every_s=3600,
    )
    first = worker.pass_once()
    assert first is not None and worker.pass_once() is None  # idle
    store.admit(call_request(tool_call_id="tc-a2", idempotency_key="a2"))  # 2 events, all in t:acme
    assert worker.pass_once() is None and worker.age_s() is not None
    store.admit(call_request(tool_call_id="tc-a3", idempotency_key="a3"))  # partition "" has not moved
    made = worker.pass_once()

    assert made is not None and made.anchor.seq == first.anchor.seq == 1
    assert dict((name, seq) for name, seq, _ in made.anchor.heads)["t:acme"] == 7
    assert store.verify([made.anchor]).ok
