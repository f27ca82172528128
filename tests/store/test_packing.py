"""Payloads and a call's JSON columns are stored packed (store.packing, migration 0015): the text read
back is the text that was hashed, a database of the previous head upgrades in place and still
verifies, and a damaged packed value is a corrupt event, never a crash."""

from __future__ import annotations

import hashlib
import json

from alembic import command
from hypothesis import given
from hypothesis import strategies as st

from store import Store
from store.canonical import canonical_json
from store.packing import DICTIONARY_1, PACKED_1, pack, unpack
from tests.store import tamper
from tests.store.builders import NOW, call_request, outcome

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


def test_the_dictionary_packed_rows_need_is_never_edited() -> None:
    # Rows packed against it are unreadable with any other: a new dictionary needs a new marker byte.
    assert hashlib.sha256(DICTIONARY_1).hexdigest() == (
        "7aeae9edb9e2b173e9dd954d85bd810e560169562ec03b1a95e370090395f25a"
    )


def test_text_that_starts_with_the_marker_byte_is_never_mistaken_for_packed_text() -> None:
    text = chr(PACKED_1) + "x"
    assert pack(text)[:1] == bytes((PACKED_1,))
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


def settled_calls(store: Store, count: int, first: int = 1) -> None:
    for n in range(first, first + count):
        store.admit(call_request(tool_call_id=f"tc-{n}", idempotency_key=f"k{n}"))
        store.record_outcome(outcome(f"tc-{n}", "completed", result={"n": n, "text": "a" * 200}, now=NOW))


def _stored_payloads(store: Store) -> list[bytes | str]:
    with store.engine.connect() as conn:
        return [row[0] for row in conn.exec_driver_sql("SELECT payload FROM events ORDER BY seq")]


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
    old = _stored_payloads(store)
    assert [value if isinstance(value, str) else bytes(value).decode() for value in old] == [
        row["payload"] for row in before
    ]

    with store.engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "head")

    assert tamper.rows(store) == before  # same text, same hashes: old checkpoints still hold
    assert [store.get_call(f"tc-{n}") for n in (1, 2, 3)] == calls
    assert store.verify().ok
    settled_calls(store, 1, first=4)
    new = _stored_payloads(store)[len(before) :]
    assert new and all(bytes(value)[:1] == bytes((PACKED_1,)) for value in new)
    assert store.get_call("tc-4").result == {"n": 4, "text": "a" * 200}
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
