"""Payloads and a call's JSON columns are stored packed (store.packing) and event ids as 16 bytes
(migration 0015), embedded JSON written out against a second dictionary (0021); derived keys,
timestamps, a correlation id equal to the call's id and the ids of calls in compact forms (0016,
0018, 0019, 0022, store.schema): the value read back is the value written (for an event, the text
that was hashed), a database of an earlier head upgrades in place and still verifies, and a damaged
packed value is a corrupt event, never a crash."""

from __future__ import annotations

import gzip
import hashlib
import json
import uuid
import zlib
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from alembic import command
from hypothesis import given
from hypothesis import strategies as st
from pytest import MonkeyPatch

from store import Store, packing
from store.canonical import canonical_json
from store.events import format_ts, new_event_id
from store.exporting import EventFilter
from store.packing import DICTIONARY_1, DICTIONARY_2, PACKED_1, PACKED_2, pack, unpack
from store.schema import (
    call_id_bytes,
    call_id_text,
    digest_bytes,
    digest_text,
    id_bytes,
    id_text,
    time_bytes,
    time_text,
)
from tests.store import tamper
from tests.store.builders import NOW, REQUIRE_APPROVAL, call_request, new_id, outcome

PREVIOUS_HEAD = "0014_expiring_marks"


@given(st.text())
def test_any_text_unpacks_to_itself(text: str) -> None:
    assert unpack(pack(text)) == text


@given(st.dictionaries(st.text(), st.one_of(st.none(), st.booleans(), st.integers(), st.text())))
def test_any_json_object_unpacks_to_its_canonical_text(value: dict[str, object]) -> None:
    text = canonical_json(value)
    stored = pack(text)
    assert unpack(stored) == text
    assert len(stored) <= len(text.encode("utf-8"))  # never longer than the text itself


def test_the_dictionaries_packed_rows_need_are_never_edited() -> None:
    # Rows packed against one are unreadable with any other: a new dictionary needs a new marker byte.
    assert hashlib.sha256(DICTIONARY_1).hexdigest() == (
        "7aeae9edb9e2b173e9dd954d85bd810e560169562ec03b1a95e370090395f25a"
    )
    assert hashlib.sha256(DICTIONARY_2).hexdigest() == (
        "c43b9deb31fa72bb21ad653a8bf01fb12b48046e57734a209fb77238be80e737"
    )


_JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text()),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(), inner, max_size=4)),
    max_leaves=12,
)


@given(_JSON, st.sampled_from([{}, {"ensure_ascii": False}, {"indent": 2}, {"separators": (",", ":")}]))
def test_a_result_whose_text_is_json_reads_back_as_its_canonical_text(
    value: object, dumps: dict[str, object]
) -> None:
    # Whatever JSON a tool puts in its text content, however it spells it (the string written out
    # whenever escaping it again gives it back), the stored form reads back as the very text.
    text = canonical_json(
        {"content": [{"type": "text", "text": json.dumps(value, **dumps)}], "structuredContent": value}  # type: ignore[arg-type]
    )
    assert unpack(pack(text)) == text


def test_a_result_echoing_its_structured_content_as_text_packs_smaller_than_before() -> None:
    answer = {
        "refund_id": "rf_8c1ab8f49701434c9a94",
        "order_id": "1003",
        "amount": 0.01,
        "currency": "USD",
        "reason": "benchmark 999-a3d2091c",
        "idempotency_key": "bench-writ-999-f8d8f815d66f",
        "status": "succeeded",
    }
    text = canonical_json(
        {
            "content": [{"type": "text", "text": json.dumps(answer, separators=(",", ":"))}],
            "isError": False,
            "structuredContent": answer,
        }
    )
    first = zlib.compressobj(6, zlib.DEFLATED, -12, 4, zlib.Z_DEFAULT_STRATEGY, DICTIONARY_1)
    before = 1 + len(first.compress(text.encode()) + first.flush())
    stored = pack(text)
    assert stored[:1] == bytes((PACKED_2,)) and unpack(stored) == text
    assert len(stored) <= before - 40


@pytest.mark.parametrize(
    "text",
    [
        "\x02x",
        '{"a":"\x02","b":"q\\"u"}',
        '{"a":"\\"\\u0002\\""}',
        '{"a":"\\"\\u0003"}',
        'not "json\\" at all"\x03',
        '{"a":"\\"\\ud800\\""}',
        '{"a":"\\"\\x"}',
    ],
)
def test_text_holding_the_bytes_that_mark_written_out_strings_reads_back_as_it_is(text: str) -> None:
    assert unpack(pack(text)) == text


@given(st.text(alphabet='"\\{}:,ab', max_size=40))
def test_text_of_quotes_and_backslashes_reads_back_as_it_is(text: str) -> None:
    # Strings are found from escaped quotes, in text that need not be JSON: whatever is written out
    # must give back the very text, or it is not written out.
    assert unpack(pack(text)) == text


def test_rows_packed_against_the_first_dictionary_still_read_back() -> None:
    text = canonical_json({"result": {"content": [{"type": "text", "text": '{"a": 1}'}]}})
    packer = zlib.compressobj(6, zlib.DEFLATED, -12, 4, zlib.Z_DEFAULT_STRATEGY, DICTIONARY_1)
    assert unpack(bytes((PACKED_1,)) + packer.compress(text.encode()) + packer.flush()) == text


@given(st.datetimes(min_value=datetime(1000, 1, 1), timezones=st.just(UTC)))  # format_ts pads no year
def test_an_event_time_takes_8_bytes_reads_back_as_written_and_sorts_as_its_text(moment: datetime) -> None:
    text, later = (
        format_ts(moment),
        format_ts(moment + timedelta(microseconds=1)) if moment.year < 9999 else None,
    )
    stored = time_bytes(text)
    assert stored is not None and len(stored) == 8 and time_text(stored) == text
    if later is not None:
        assert stored < (time_bytes(later) or b"")


@given(st.text())
def test_any_other_event_time_text_reads_back_as_it_is(value: str) -> None:
    stored = time_bytes(value)
    assert stored is None or time_text(stored) == value


@given(st.one_of(st.text(), st.uuids().map(str), st.uuids().map(lambda u: str(u).upper())))
def test_any_event_id_reads_back_as_it_was_written(event_id: str) -> None:
    assert id_text(id_bytes(event_id)) == event_id


def test_a_uuid_event_id_takes_16_bytes_unless_its_first_byte_is_the_marker() -> None:
    assert len(id_bytes(new_event_id())) == 16
    marked = str(uuid.UUID(bytes=b"\xff" + bytes(15)))
    assert id_bytes(marked)[:1] == b"\xff" and id_text(id_bytes(marked)) == marked


@given(st.text(), st.one_of(st.binary(min_size=32, max_size=32), st.binary(min_size=20, max_size=20)))
def test_any_text_ending_in_a_digest_reads_back_as_it_was_written(prefix: str, digest: bytes) -> None:
    value = prefix + digest.hex()
    stored = digest_bytes(value)
    # At least the digest's digits as bytes; more when the prefix ends in hex digits that make the
    # tail 64 digits long (a 20-byte digest after 24 of them is kept as a 32-byte one).
    assert stored is not None and len(stored) <= 1 + len(value.encode("utf-8")) - len(digest)
    assert digest_text(stored) == value


@given(st.text(alphabet="0123456789abcdefx:", max_size=80))
def test_text_not_ending_in_a_digest_is_kept_as_it_is(value: str) -> None:
    if digest_bytes(value) is None:
        assert len(value) < 40 or any(c not in "0123456789abcdef" for c in value[-40:])
    else:
        assert digest_text(digest_bytes(value) or b"") == value


def test_the_gateways_derived_key_takes_20_bytes_for_its_40_digits() -> None:
    # gateway.calls.actions.derived_key: "derived:" and the first 40 hex digits of a sha256.
    key = "derived:" + hashlib.sha256(b"call").hexdigest()[:40]
    assert digest_bytes(key) == b"\xfdderived:" + bytes.fromhex(key[-40:])
    action = "sha256:" + hashlib.sha256(b"call").hexdigest()
    assert digest_bytes(action) == b"\xfesha256:" + hashlib.sha256(b"call").digest()  # as 0015 wrote it


@given(st.text())
def test_any_call_id_reads_back_as_it_was_written(value: str) -> None:
    stored = call_id_bytes(value)
    assert stored is None or call_id_text(stored) == value


# Minted ids drawn as their parts (a regex strategy draws them several times slower).
_PREFIXES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=16)
_DIGITS = st.binary(min_size=14, max_size=14).map(bytes.hex)
_MINTED_IDS = st.builds(lambda prefix, digits: f"{prefix}_{digits}", _PREFIXES, _DIGITS)


@given(_MINTED_IDS)
def test_a_minted_call_id_takes_its_prefix_and_14_bytes(value: str) -> None:
    prefix = value.split("_")[0]
    assert call_id_bytes(value) == b"\xfc" + prefix.encode() + bytes.fromhex(value[-28:])
    assert call_id_text(call_id_bytes(value) or b"") == value


@given(st.lists(_DIGITS.map("tc_{}".format), min_size=2))
def test_minted_call_ids_sort_stored_as_they_sort_as_text(values: list[str]) -> None:
    # `running` and `reconciling` break ties by tool_call_id: the order is the order it was.
    assert sorted(values, key=lambda v: call_id_bytes(v) or b"") == sorted(values)


@pytest.mark.parametrize("value", ["tc-1", "TC_" + "a" * 28, "tc_" + "A" * 28, "tc_" + "a" * 27, "\xfc", ""])
def test_an_id_the_gateway_did_not_mint_is_kept_as_its_text(value: str) -> None:
    assert call_id_bytes(value) is None


@pytest.mark.parametrize("marker", [PACKED_1, PACKED_2])
def test_text_that_starts_with_a_marker_byte_is_never_mistaken_for_packed_text(marker: int) -> None:
    text = chr(marker) + "x"
    assert pack(text)[:1] in (bytes((PACKED_1,)), bytes((PACKED_2,)))
    assert unpack(pack(text)) == text


def test_damaged_packed_bytes_read_as_text_that_is_not_json() -> None:
    stored = pack(canonical_json({"result": {"content": [{"type": "text", "text": "hello"}]}}))
    for damaged in (stored[:-3], stored[:1] + b"\xff" * 8, stored + b"more"):
        text = unpack(damaged)
        try:
            json.loads(text)
        except ValueError:
            continue
        raise AssertionError(f"{damaged!r} read as JSON: {text!r}")


def test_a_forged_row_that_unpacks_without_end_reads_as_unreadable_text(monkeypatch: MonkeyPatch) -> None:
    # Deflate expands about 1,000 times: whoever can write the database could forge a few KB that
    # unpack to gigabytes. Unpacking stops at MAX_UNPACKED (lowered here so the test stays small).
    monkeypatch.setattr(packing, "MAX_UNPACKED", 1024 * 1024)
    packer = zlib.compressobj(9, zlib.DEFLATED, -15, 9, zlib.Z_DEFAULT_STRATEGY, DICTIONARY_1)
    huge = bytes((PACKED_1,)) + packer.compress(b"0" * (8 * 1024 * 1024)) + packer.flush()
    assert len(huge) < 10_000
    text = unpack(huge)
    assert len(text) < 100 and text.startswith("\ufffdunreadable stored text")
    # Within the bound, a long text packed by Writ itself (a big result) still reads back whole.
    long = canonical_json({"result": "x" * (512 * 1024)})
    assert len(pack(long)) <= 1024 and unpack(pack(long)) == long


def test_a_forged_row_whose_written_out_text_escapes_past_the_bound_reads_as_unreadable(
    monkeypatch: MonkeyPatch,
) -> None:
    # Escaped again, a written-out string grows: the bound holds for the text a reader gets, and a
    # character that escapes in six (never written out by Writ) marks the row as forged.
    monkeypatch.setattr(packing, "MAX_UNPACKED", 1024 * 1024)
    for inner in (b'"' * (600 * 1024), b"\x01" * 10):
        packer = zlib.compressobj(9, zlib.DEFLATED, -15, 9, zlib.Z_DEFAULT_STRATEGY, DICTIONARY_2)
        forged = bytes((PACKED_2,)) + packer.compress(b"[\x02" + inner + b"\x03]") + packer.flush()
        text = unpack(forged)
        assert len(text) < 100 and text.startswith("\ufffdunreadable stored text")
    # A big result of Writ's own, with a JSON text beside it, still reads back whole.
    long = canonical_json({"content": [{"text": json.dumps({"a": "x" * 100_000}), "type": "text"}]})
    assert pack(long)[:1] == bytes((PACKED_2,)) and unpack(pack(long)) == long


def _key(n: int) -> str:
    # A key ending in a whole sha256 or in the 40 digits the gateway derives (stored as bytes), or a
    # client's own key (text).
    digest = hashlib.sha256(str(n).encode()).hexdigest()
    return ("derived:" + digest, "derived:" + digest[:40], f"k{n}")[n % 3]


def settled_calls(store: Store, count: int, first: int = 1) -> None:
    for n in range(first, first + count):
        store.admit(call_request(tool_call_id=f"tc-{n}", idempotency_key=_key(n)))
        store.record_outcome(outcome(f"tc-{n}", "completed", result={"n": n, "text": "a" * 200}, now=NOW))


def _stored(store: Store, column: str = "payload") -> list[bytes | str]:
    with store.engine.connect() as conn:
        return [row[0] for row in conn.exec_driver_sql(f"SELECT {column} FROM events ORDER BY seq")]


def _text(value: bytes | str) -> str:
    return value if isinstance(value, str) else bytes(value).decode()


def test_a_database_of_the_previous_head_upgrades_in_place_and_still_verifies(own_store: Store) -> None:
    store = own_store  # the downgrade changes the schema: never the suite's shared one
    config = store._alembic_config()
    settled_calls(store, 3)
    before = tamper.rows(store)
    calls = [store.get_call(f"tc-{n}") for n in (1, 2, 3)]
    # Down to the previous head: every value is text again, as that head wrote it.
    with store.engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, PREVIOUS_HEAD)
    assert [_text(value) for value in _stored(store)] == [row["payload"] for row in before]
    assert [_text(value) for value in _stored(store, "event_id")] == [row["event_id"] for row in before]

    with store.engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "head")

    assert tamper.rows(store) == before  # same text, same hashes: old checkpoints still hold
    assert [store.get_call(f"tc-{n}") for n in (1, 2, 3)] == calls
    assert store.verify().ok
    settled_calls(store, 1, first=4)
    new = _stored(store)[len(before) :]
    assert new and all(bytes(value)[:1] == bytes((PACKED_2,)) for value in new)
    assert all(len(bytes(value)) == 16 for value in _stored(store, "event_id"))  # old rows converted too
    assert store.get_call("tc-4").result == {"n": 4, "text": "a" * 200}  # type: ignore[union-attr]
    # The ledger still finds each key, derived or not: a second claim gets the call that holds it.
    for n in (1, 2, 3, 4):
        assert store.admit(
            call_request(tool_call_id=f"again-{n}", idempotency_key=_key(n))
        ).call.tool_call_id == (f"tc-{n}")
    assert store.verify().ok
    rebuilt_from = [store.get_call(f"tc-{n}") for n in (1, 2, 3, 4)]
    store.rebuild()
    assert [store.get_call(f"tc-{n}") for n in (1, 2, 3, 4)] == rebuilt_from


def test_a_packed_payload_damaged_on_disk_is_named_by_verify(store: Store) -> None:
    settled_calls(store, 2)
    with store.engine.begin() as conn:
        (raw,) = conn.exec_driver_sql("SELECT payload FROM events WHERE seq = 2").one()
        damaged = bytes(raw)[:-4] + b"\x00\x00\x00\x00"
        conn.exec_driver_sql(
            "UPDATE events SET payload = %(p)s WHERE seq = 2"
            if store.engine.dialect.name == "postgresql"
            else "UPDATE events SET payload = :p WHERE seq = 2",
            {"p": damaged},
        )

    report = store.verify()
    assert not report.ok
    assert report.first_bad_seq == 2


def _ledger_keys(store: Store) -> list[bytes | str]:
    with store.engine.connect() as conn:
        return [row[0] for row in conn.exec_driver_sql("SELECT idempotency_key FROM effect_ledger")]


def test_keys_written_before_short_digests_are_converted_and_still_claim(own_store: Store) -> None:
    store = own_store
    config = store._alembic_config()
    settled_calls(store, 3)
    calls = [store.get_call(f"tc-{n}") for n in (1, 2, 3)]
    short = _key(1)  # n % 3 == 1: the gateway's 40 digits
    with store.engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0015_packed_values")
    assert short in _ledger_keys(store) or short.encode() in [bytes(k) for k in _ledger_keys(store)]  # text

    with store.engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "head")

    stored = {
        digest_text(bytes(key)) if not isinstance(key, str) else key: key for key in _ledger_keys(store)
    }
    assert bytes(stored[short]) == b"\xfdderived:" + bytes.fromhex(short[-40:])
    assert bytes(stored[_key(3)]) == b"\xfederived:" + bytes.fromhex(_key(3)[-64:])
    assert [store.get_call(f"tc-{n}") for n in (1, 2, 3)] == calls
    for n in (1, 2, 3):  # a second claim of each converted key gets the call that holds it
        assert store.admit(
            call_request(tool_call_id=f"again-{n}", idempotency_key=_key(n))
        ).call.tool_call_id == (f"tc-{n}")
    assert store.verify().ok


def _correlations(store: Store, table: str) -> list[str | None]:
    with store.engine.connect() as conn:
        return [row[0] for row in conn.exec_driver_sql(f"SELECT correlation_id FROM {table}")]


@pytest.mark.parametrize(
    ("correlation", "stored"), [("own", ""), ("", "\x01"), ("\x01x", "\x01\x01x"), ("corr-1", "corr-1")]
)
def test_a_correlation_id_reads_back_as_written_and_the_calls_own_id_is_stored_as_nothing(
    store: Store, tmp_path: Path, correlation: str, stored: str
) -> None:
    # The gateway correlates a call in no run by its own tool_call_id; every event and the call's row
    # would repeat it. Whatever the id, every reader gets it back: events, export, the call, the
    # events written later from the call's row, an archive, verify and rebuild.
    wanted = "tc-1" if correlation == "own" else correlation
    store.admit(
        call_request(
            tool_call_id="tc-1", idempotency_key="k1", correlation_id=wanted, run_id=None, run_origin=None
        )
    )
    store.record_outcome(outcome("tc-1", "completed", result={"n": 1}, now=NOW))

    assert _correlations(store, "tool_calls") == [stored]
    assert _correlations(store, "events") == [stored] * 3
    assert [e.correlation_id for e in store.events()] == [wanted] * 3
    assert [e["correlation_id"] for e in store.export()] == [wanted] * 3
    assert store.get_call("tc-1").correlation_id == wanted  # type: ignore[union-attr]
    assert store.verify().ok
    before = store.get_call("tc-1")
    store.rebuild()
    assert store.get_call("tc-1") == before

    head_seq, _ = store.log_head()
    assert store.archive(tmp_path, upto_seq=head_seq, before=NOW + timedelta(days=400)) is not None
    with gzip.open(next(tmp_path.glob("*.gz")), "rt") as archived:
        assert {
            json.loads(line)["correlation_id"] for line in archived if json.loads(line)["tool_call_id"]
        } == {wanted}
    assert store.verify(archive=tmp_path).ok


def test_event_times_are_stored_as_8_bytes_and_the_exports_range_still_selects_by_time(store: Store) -> None:
    for n, at in enumerate((NOW, NOW + timedelta(hours=1), NOW + timedelta(hours=2)), start=1):
        store.admit(call_request(tool_call_id=f"tc-{n}", idempotency_key=f"k{n}", now=at))
    assert {len(bytes(value)) for value in _stored(store, "occurred_at")} == {8}
    middle = [
        e["tool_call_id"]
        for e in store.export(
            EventFilter(since=NOW + timedelta(minutes=30), until=NOW + timedelta(minutes=90))
        )
    ]
    assert set(middle) == {"tc-2"}
    assert [e.occurred_at for e in store.events(tool_call_id="tc-3")][0] == format_ts(
        NOW + timedelta(hours=2)
    )
    assert store.verify().ok


def test_a_calls_times_take_8_bytes_on_sqlite_and_read_back_as_written(store: Store) -> None:
    later = NOW + timedelta(seconds=3, microseconds=7)
    store.admit(call_request(tool_call_id="tc-1", idempotency_key="k1"))
    store.record_outcome(outcome("tc-1", "completed", result={"n": 1}, now=later))
    store.admit(call_request(tool_call_id="tc-0", idempotency_key="k0", now=NOW - timedelta(days=1)))

    call = store.get_call("tc-1")
    assert call is not None and (call.created_at, call.updated_at) == (NOW, later)
    assert [c.tool_call_id for c in store.list_calls()] == ["tc-1", "tc-0"]  # newest first, by created_at
    if store.engine.dialect.name == "sqlite":  # PostgreSQL's timestamptz is 8 bytes already
        for table, column in (
            ("tool_calls", "created_at"),
            ("tool_calls", "updated_at"),
            ("effect_ledger", "claimed_at"),
        ):
            assert {len(bytes(value)) for value in _stored_in(store, table, column)} == {8}


def _stored_in(store: Store, table: str, column: str) -> list[bytes | str]:
    with store.engine.connect() as conn:
        return [row[0] for row in conn.exec_driver_sql(f"SELECT {column} FROM {table}")]


def test_a_downgrade_before_embedded_json_leaves_text_the_earlier_revisions_read(own_store: Store) -> None:
    store = own_store  # the downgrade changes the schema: never the suite's shared one
    config = store._alembic_config()
    echoed = {"content": [{"type": "text", "text": '{"id": "rf_1"}'}], "structuredContent": {"id": "rf_1"}}
    store.admit(call_request(tool_call_id="tc-1", idempotency_key="k1"))
    store.record_outcome(outcome("tc-1", "completed", result=echoed, now=NOW))
    before, call = tamper.rows(store), store.get_call("tc-1")
    assert bytes(_stored(store)[-1])[:1] == bytes((PACKED_2,))
    assert bytes(_stored_in(store, "tool_calls", "result")[0])[:1] == bytes((PACKED_2,))

    with store.engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0020_approvals_by_expiry")
    # No 0x02 is left for a gateway of an earlier revision, which unpacks only 0x01 and reads the rest
    # as the text it is; the 0x01 rows stay packed.
    for value in [*_stored(store), *_stored_in(store, "tool_calls", "result")]:
        assert bytes(value if not isinstance(value, str) else value.encode())[:1] != bytes((PACKED_2,))
    assert json.loads(_text(_stored_in(store, "tool_calls", "result")[0])) == echoed

    with store.engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "head")
    assert tamper.rows(store) == before  # the same texts, the same hashes
    assert store.get_call("tc-1") == call
    assert store.verify().ok


_CALL_ID_TABLES = ("events", "tool_calls", "effect_ledger", "approvals")


def _call_ids(store: Store) -> dict[str, list[bytes | str]]:
    with store.engine.connect() as conn:
        # Sorted: an upgrade may update rows (0025 marks calls whose keys went out scoped), and
        # PostgreSQL then returns them in another order.
        return {
            table: sorted(
                bytes(row[0]) if isinstance(row[0], memoryview) else row[0]
                for row in conn.exec_driver_sql(
                    f"SELECT tool_call_id FROM {table} WHERE tool_call_id IS NOT NULL"
                )
            )
            for table in _CALL_ID_TABLES
        }


def test_minted_call_ids_take_17_bytes_in_every_table_and_a_downgrade_leaves_text(own_store: Store) -> None:
    store = own_store  # the downgrade changes the schema: never the suite's shared one
    config = store._alembic_config()
    settled, held = new_id("tc"), new_id("tc")
    store.admit(call_request(tool_call_id=settled, idempotency_key="k-settled"))
    store.record_outcome(outcome(settled, "completed", result={"ok": True}, now=NOW))
    store.admit(call_request(tool_call_id=held, idempotency_key="k-held", decision=REQUIRE_APPROVAL))
    stored = _call_ids(store)
    assert all(stored.values()), stored  # each table holds a call's id
    for table, values in stored.items():
        assert all(bytes(value)[:1] == b"\xfc" and len(bytes(value)) == 17 for value in values), table
    before = tamper.rows(store)
    calls = [store.get_call(settled), store.get_call(held)]
    timelines = [store.events(tool_call_id=settled), store.events(tool_call_id=held)]

    with store.engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0021_embedded_json")
    # What the revisions before read: each id as its text.
    for table, values in _call_ids(store).items():
        assert sorted(_text(value) for value in values) == sorted(
            call_id_text(bytes(value)) for value in stored[table]
        ), table

    with store.engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "head")
    assert _call_ids(store) == stored
    assert tamper.rows(store) == before  # the same texts, the same hashes
    assert [store.get_call(settled), store.get_call(held)] == calls
    assert [store.events(tool_call_id=settled), store.events(tool_call_id=held)] == timelines
    assert store.list_approvals()[0].tool_call_id == held
    # The ledger's holder is found by its converted id: a second claim of the key gets that call.
    assert store.admit(call_request(tool_call_id=new_id("tc"), idempotency_key="k-settled")).call == calls[0]
    assert store.verify().ok
