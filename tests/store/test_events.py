"""The event contract: every type exists, envelopes round-trip, and the hash covers every field."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from store import events as ev
from store.canonical import CanonicalizationError

CONTRACT_TYPES = {
    "run.started",
    "tool_call.requested",
    "tool_call.denied",
    "approval.required",
    "approval.granted",
    "approval.rejected",
    "approval.expired",
    "tool_call.dispatching",
    "tool_call.completed",
    "tool_call.failed",
    "tool_call.result_unknown",
    "reconciliation.started",
    "reconciliation.resolved",
    "reconciliation.escalated",
    "budget.exceeded",
    "loop.detected",
}


def test_every_contract_event_type_has_a_model() -> None:
    # The contract only grows: types may be added (reconciliation.inconclusive), never renamed.
    assert CONTRACT_TYPES <= ev.TYPE_NAMES


def test_a_sealed_event_round_trips_through_its_envelope_with_the_same_hash() -> None:
    event = ev.LoopDetectedEvent(
        occurred_at="2026-11-30T12:00:00.000000Z",
        producer="writ-gateway",
        tenant="acme",
        payload=ev.LoopDetected(action_hash="h", count=5, window_s=60),
    ).sealed(7, "a" * 64)

    parsed = ev.parse_event(event.envelope())

    assert parsed == event
    assert isinstance(parsed, ev.LoopDetectedEvent)
    assert ev.compute_hash(parsed.envelope()) == event.hash
    assert event.schema_version == ev.SCHEMA_VERSION == 2


def test_sealing_returns_the_envelope_that_the_sealed_event_dumps_to() -> None:
    event = ev.ToolCallCompletedEvent(
        occurred_at="2026-11-30T12:00:00.000000Z",
        producer="writ-gateway",
        tool_call_id="tc-1",
        tenant="acme",
        seq=3,
        prev_hash="b" * 64,
        hash="stale",
        payload=ev.ToolCallCompleted(result={"b": [1, None], "a": "späť"}, evidence={"status": 200}),
    )

    sealed, envelope = event.sealed_with_envelope(7, "a" * 64)

    assert sealed == event.sealed(7, "a" * 64)
    assert envelope == sealed.envelope()
    assert (sealed.seq, sealed.prev_hash, sealed.hash) == (7, "a" * 64, ev.compute_hash(envelope))


def test_timestamps_are_utc_with_microseconds_and_z() -> None:
    from datetime import datetime, timedelta, timezone

    moment = datetime(2026, 1, 2, 4, 5, 6, 7, tzinfo=timezone(timedelta(hours=1)))

    assert ev.format_ts(moment) == "2026-01-02T03:05:06.000007Z"
    assert ev.parse_ts(ev.format_ts(moment)) == moment
    assert ev.parse_ts(ev.format_ts(moment)).tzinfo is UTC


@given(st.datetimes(min_value=datetime(1000, 1, 1), timezones=st.just(UTC)))
def test_parsing_a_formatted_timestamp_gives_what_strptime_gives(moment: datetime) -> None:
    text = ev.format_ts(moment)

    assert ev.parse_ts(text) == datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)


def test_timestamps_in_other_spellings_are_read_as_before() -> None:
    # Only the exact format_ts spelling takes the fast path; strptime judges everything else.
    assert ev.parse_ts("2026-01-02T03:05:06.7Z") == datetime(2026, 1, 2, 3, 5, 6, 700000, tzinfo=UTC)
    for text in ("2026-01-02T03:05:06Z", "2026-01-02T03:05:06.000007+00:00", "2026-02-30T03:05:06.000007Z"):
        with pytest.raises(ValueError):
            ev.parse_ts(text)


def test_canonical_json_sorts_keys_without_spaces_and_keeps_unicode() -> None:
    assert ev.canonical_json({"b": 1, "a": "späť"}) == '{"a":"späť","b":1}'


text = st.text(max_size=12)
envelopes = st.fixed_dictionaries(
    {
        "event_id": text,
        "seq": st.integers(min_value=1, max_value=2**53),
        "type": st.sampled_from(sorted(CONTRACT_TYPES)),
        "schema_version": st.just(1),
        "occurred_at": text,
        "producer": text,
        "run_id": st.none() | text,
        "tool_call_id": st.none() | text,
        "approval_id": st.none() | text,
        "capability_id": st.none() | text,
        "capability_version": st.none() | text,
        "policy_version": st.none() | text,
        "correlation_id": st.none() | text,
        "causation_id": st.none() | text,
        "tenant": st.none() | text,
        "payload": st.dictionaries(text, st.none() | st.booleans() | st.integers() | text, max_size=4),
        "prev_hash": st.text("0123456789abcdef", min_size=64, max_size=64),
        "hash": st.just(""),
    }
)


def changed(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, int):
        return value + 1
    if isinstance(value, dict):
        return {**value, "\x00changed": True}
    return value + "x"


@given(envelopes, st.sampled_from([name for name in ev.ENVELOPE_FIELDS if name != "hash"]))
def test_changing_any_envelope_field_changes_the_hash(envelope: dict[str, Any], name: str) -> None:
    tampered = {**envelope, name: changed(envelope[name])}

    assert ev.compute_hash(tampered) != ev.compute_hash(envelope)


@given(envelopes, text)
def test_the_hash_does_not_depend_on_the_stored_hash_field(envelope: dict[str, Any], other: str) -> None:
    assert ev.compute_hash({**envelope, "hash": other}) == ev.compute_hash(envelope)


def _envelopes(texts: st.SearchStrategy[str], floats: st.SearchStrategy[float]) -> st.SearchStrategy[Any]:
    # The slot the payload's text is put into, and what escapes a quote, also spelled as values.
    texts = texts | st.sampled_from(['"payload":null', '","payload":null,"', "\\", '\\"', "\u20ac"])
    values = st.recursive(
        st.none() | st.booleans() | st.integers(-(10**30), 10**30) | floats | texts,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
        max_leaves=16,
    )
    optional = ("run_id", "tool_call_id", "approval_id", "capability_id", "capability_version")
    optional += ("policy_version", "correlation_id", "causation_id", "tenant")
    return st.fixed_dictionaries(
        {
            "event_id": texts,
            "seq": st.integers(min_value=1, max_value=2**63),
            "type": st.sampled_from(sorted(CONTRACT_TYPES)),
            "schema_version": st.sampled_from([1, 2]),
            "occurred_at": texts,
            "producer": texts,
            **{name: st.none() | texts for name in optional},
            "payload": st.dictionaries(texts, values, max_size=5),
            "prev_hash": texts,
            "hash": texts,
        }
    )


# JSON as the log holds it, and anything else a spelling may refuse (lone surrogates, NaN, infinity).
json_envelopes = _envelopes(st.text(max_size=12), st.floats(allow_nan=False, allow_infinity=False))
any_envelopes = _envelopes(st.text(max_size=12) | st.sampled_from(["\ud800", "a\udfffb"]), st.floats())


REFUSED = "refused"


def _outcome(spell: Callable[[], str]) -> str:
    # Which refusal is not compared: an envelope holding both a lone surrogate and an infinity is
    # refused for whichever of the two the spelling meets first, and spelled apart it meets them in
    # another order. That it is refused either way is what matters.
    try:
        return spell()
    except (CanonicalizationError, ValueError):
        return REFUSED


@given(json_envelopes | any_envelopes)
def test_the_hashed_text_with_the_payload_spelled_apart_is_the_envelope_spelled_whole(
    envelope: dict[str, Any],
) -> None:
    # Appending spells the payload once (the stored row's) and puts it into the envelope's text.
    spell = ev.json_for(envelope["schema_version"])
    whole = _outcome(lambda: spell({name: envelope[name] for name in ev.ENVELOPE_FIELDS if name != "hash"}))

    spliced = _outcome(lambda: ev.hashed_text(envelope, spell(envelope["payload"])))

    assert spliced == whole
    assert _outcome(lambda: ev.hashed_text(envelope)) == whole


def test_a_sealed_event_hashes_the_payload_text_it_stores() -> None:
    event = ev.ToolCallCompletedEvent(
        occurred_at="2026-11-30T12:00:00.000000Z",
        producer="writ-gateway",
        tool_call_id="tc-1",
        tenant="acme",
        payload=ev.ToolCallCompleted(result={"b": [1.5, 2**70], "a": "späť"}, evidence={"status": 200}),
    )

    sealed, envelope, payload_text = event.sealed_with_payload_text(7, "a" * 64)

    assert payload_text == ev.canonical_json(envelope["payload"])
    assert sealed.hash == ev.compute_hash(envelope) == ev.compute_hash(envelope, payload_text)


def test_event_ids_are_uuid7_ordered_by_the_millisecond_they_were_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = iter(range(1_700_000_000_000_000_000, 1_700_000_000_100_000_000, 1_000_000))
    monkeypatch.setattr(ev.time, "time_ns", lambda: next(clock))

    ids = [ev.new_event_id() for _ in range(50)]

    assert ids == sorted(ids)
    assert len(set(ids)) == 50
    assert {uuid.UUID(i).version for i in ids} == {7}
    assert {uuid.UUID(i).variant for i in ids} == {uuid.RFC_4122}
    assert uuid.UUID(ids[0]).int >> 80 == 1_700_000_000_000
