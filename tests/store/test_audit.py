"""`verify` accepts an untouched log and names the first bad seq of a tampered one."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import update

from store import Store
from store.schema import events
from tests.store import tamper
from tests.store.builders import DENY, NOW, call_request, outcome

EVENTS = 9


@pytest.fixture
def logged(store: Store) -> Store:
    """A log of nine events: three calls (allowed and completed, denied, allowed)."""
    store.admit(call_request(tool_call_id="tc-1", idempotency_key="k1"))  # seq 1-3
    store.record_outcome(outcome("tc-1", "completed", result={"ok": True}, now=NOW))  # 4
    store.admit(call_request(tool_call_id="tc-2", idempotency_key="k2", decision=DENY))  # 5-6
    store.admit(
        call_request(tool_call_id="tc-3", idempotency_key="k3", now=NOW + timedelta(seconds=1))
    )  # 7-8
    store.record_outcome(outcome("tc-3", "unknown", error="timeout", now=NOW))  # 9
    assert len(store.events()) == EVENTS
    return store


def test_an_untouched_log_verifies(logged: Store) -> None:
    report = logged.verify()

    assert report.ok, report
    assert report.events_checked == EVENTS
    assert report.first_bad_seq is None


def test_an_empty_log_verifies(store: Store) -> None:
    assert store.verify().ok


def test_the_chain_links_each_event_to_the_one_before(logged: Store) -> None:
    chain = logged.events()

    assert chain[0].prev_hash == "0" * 64
    assert all(later.prev_hash == earlier.hash for earlier, later in zip(chain, chain[1:], strict=False))


def test_an_edited_payload_is_reported_at_its_seq(logged: Store) -> None:
    tamper.edit_payload(logged, 4)

    report = logged.verify()

    assert (report.ok, report.problem, report.first_bad_seq) == (False, "edited", 4)
    assert report.events_checked == 3


def test_a_deleted_event_in_the_middle_is_reported_at_its_seq(logged: Store) -> None:
    tamper.delete_event(logged, 5)

    report = logged.verify()

    assert (report.problem, report.first_bad_seq) == ("deleted", 5)


def test_a_deleted_last_event_is_reported_as_truncation_at_its_seq(logged: Store) -> None:
    tamper.delete_event(logged, EVENTS)

    report = logged.verify()

    assert (report.problem, report.first_bad_seq) == ("truncated", EVENTS)


def test_an_event_inserted_in_the_middle_is_reported_at_its_seq(logged: Store) -> None:
    tamper.insert_forged_event(logged, 6)

    report = logged.verify()

    assert (report.problem, report.first_bad_seq) == ("inserted", 6)


def test_an_event_appended_behind_the_heads_back_is_reported(logged: Store) -> None:
    tamper.append_forged_event(logged)

    report = logged.verify()

    assert (report.problem, report.first_bad_seq) == ("inserted", EVENTS + 1)


@pytest.mark.parametrize("seq", [0, -5])
def test_an_event_inserted_below_seq_1_is_reported_at_its_seq(logged: Store, seq: int) -> None:
    # Every read pages from seq 1 up, so verify walked past it and said the chain was intact.
    tamper.insert_before_the_first(logged, seq)

    report = logged.verify()

    assert (report.ok, report.problem, report.first_bad_seq) == (False, "inserted", seq)


@pytest.mark.parametrize("text", ["{not json", ""])
def test_a_payload_that_is_not_json_is_reported_as_edited_at_its_seq(logged: Store, text: str) -> None:
    # json.loads raised out of verify: a traceback instead of the first bad seq.
    tamper.set_payload_text(logged, 4, text)

    report = logged.verify()

    assert (report.ok, report.problem, report.first_bad_seq) == (False, "edited", 4)


def test_a_deleted_log_head_is_reported_not_raised(logged: Store) -> None:
    tamper.delete_head(logged)

    report = logged.verify()

    assert (report.ok, report.problem) == (False, "head_missing")


def test_two_swapped_events_are_reported_as_reordered_at_the_first(logged: Store) -> None:
    tamper.swap_events(logged, 3)

    report = logged.verify()

    assert (report.problem, report.first_bad_seq) == ("reordered", 3)


def test_a_deletion_hidden_by_renumbering_is_reported_at_the_gap(logged: Store) -> None:
    tamper.delete_and_renumber(logged, 5)

    report = logged.verify()

    assert (report.problem, report.first_bad_seq) == ("deleted", 5)


def test_an_edit_with_a_recomputed_hash_breaks_the_chain_at_the_edited_event(logged: Store) -> None:
    tamper.rewrite_with_recomputed_hash(logged, 4)

    report = logged.verify()

    assert (report.problem, report.first_bad_seq) == ("broken_chain", 4)


@pytest.fixture
def with_floats(store: Store) -> Store:
    """Four events whose payloads hold floats, which the two spellings write differently (30.0 and 30,
    1e-07 and 1e-7), and a key past U+FFFF, which they order differently."""
    store.admit(call_request(tool_call_id="tc-1", idempotency_key="k1"))  # seq 1-3
    result = {"amount": 30.0, "rate": 1e-7, "big": 1e16, "id": 2**63, "\U0001f600": 1, "\uff01": 2}
    store.record_outcome(outcome("tc-1", "completed", result=result, now=NOW))  # 4
    return store


def test_a_log_written_before_rfc8785_verifies_by_each_events_schema_version(with_floats: Store) -> None:
    tamper.as_written_before_rfc8785(with_floats)

    assert [e.schema_version for e in with_floats.events()] == [1, 1, 1, 1]
    assert with_floats.verify().ok


def test_a_log_continued_after_rfc8785_verifies_across_the_change(with_floats: Store) -> None:
    tamper.as_written_before_rfc8785(with_floats, upto=2)
    with_floats.admit(call_request(tool_call_id="tc-2", idempotency_key="k2", decision=DENY))  # 5-6

    assert [e.schema_version for e in with_floats.events()] == [1, 1, 2, 2, 2, 2]
    assert with_floats.verify().ok


@pytest.mark.parametrize("version", [1, 2])
def test_an_edit_is_caught_in_either_schema_version(with_floats: Store, version: int) -> None:
    if version == 1:
        tamper.as_written_before_rfc8785(with_floats)
    tamper.edit_payload(with_floats, 4)

    report = with_floats.verify()

    assert (report.ok, report.problem, report.first_bad_seq) == (False, "edited", 4)


@pytest.mark.parametrize("version", [1, 2])
def test_relabelling_an_events_schema_version_is_caught(with_floats: Store, version: int) -> None:
    if version == 1:
        tamper.as_written_before_rfc8785(with_floats)
    with with_floats.engine.begin() as conn:
        conn.execute(update(events).where(events.c.seq == 4).values(schema_version=3 - version))

    report = with_floats.verify()

    assert (report.ok, report.problem, report.first_bad_seq) == (False, "edited", 4)


@pytest.mark.parametrize("version", [1, 2])
def test_a_rewritten_event_with_a_recomputed_hash_is_caught_in_either_version(
    with_floats: Store, version: int
) -> None:
    if version == 1:
        tamper.as_written_before_rfc8785(with_floats)
    tamper.rewrite_with_recomputed_hash(with_floats, 2)

    report = with_floats.verify()

    assert (report.ok, report.problem, report.first_bad_seq) == (False, "broken_chain", 2)


@pytest.mark.parametrize("text", ['{"amount": NaN}', '{"note": "\\ud800"}'], ids=["nan", "surrogate"])
def test_a_payload_edited_into_json_that_cannot_be_hashed_is_reported_at_its_seq(
    logged: Store, text: str
) -> None:
    tamper.set_payload_text(logged, 4, text)

    report = logged.verify()

    assert (report.ok, report.problem, report.first_bad_seq) == (False, "edited", 4)
