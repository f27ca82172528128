"""Cutting a stdio server's stdout into messages (capabilities/stdio_framing.py), no line held past the
limit: a message over it is skipped to its newline and the request it answers is told so."""

from __future__ import annotations

import json
import tracemalloc
from typing import Any

import mcp_types
from hypothesis import given
from hypothesis import strategies as st

from capabilities.stdio_framing import (
    SKIP_FACTOR,
    MessageReader,
    MessageTooLarge,
    answered_request,
    too_large_message,
)

LIMIT = 1024


def answer(id: Any, text: str = "done", *, id_last: bool = False) -> bytes:
    result = {"content": [{"type": "text", "text": text}]}
    message = (
        {"result": result, "jsonrpc": "2.0", "id": id}
        if id_last
        else {"jsonrpc": "2.0", "id": id, "result": result}
    )
    return json.dumps(message, ensure_ascii=False).encode()  # as the SDKs write it


def seen(items: list[Any]) -> list[Any]:
    """Items as comparable values: a message's JSON, an exception's type."""
    return [
        item.message.model_dump(by_alias=True, exclude_none=True)
        if not isinstance(item, Exception)
        else type(item)
        for item in items
    ]


def too_large(id: Any) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": mcp_types.PARSE_ERROR, "message": too_large_message(LIMIT)},
    }


def test_a_line_of_exactly_the_limit_is_read_and_one_byte_more_is_not() -> None:
    exact = answer(1, "")
    exact = answer(1, "x" * (LIMIT - len(exact)))
    over = answer(2, "x" * (LIMIT - len(answer(2, "")) + 1))
    assert len(exact) == LIMIT and len(over) == LIMIT + 1

    items = MessageReader(LIMIT).feed(exact + b"\n" + over + b"\n")

    assert seen(items)[0]["result"]["content"][0]["text"] == "x" * (LIMIT - len(answer(1, "")))
    assert seen(items)[1] == too_large(2)


def test_an_answer_over_the_limit_tells_its_request_whether_the_id_comes_first_or_last() -> None:
    big = "a" * (4 * LIMIT)
    stream = answer(7, big) + b"\n" + answer("req-8", big, id_last=True) + b"\n" + answer(9) + b"\n"

    items = MessageReader(LIMIT).feed(stream)

    assert seen(items) == [
        too_large(7),
        too_large("req-8"),
        seen(MessageReader(LIMIT).feed(answer(9) + b"\n"))[0],
    ]


def test_a_long_request_or_notification_from_the_server_answers_no_request_and_is_dropped() -> None:
    params = {"level": "info", "data": "a" * (4 * LIMIT)}
    notification = {"jsonrpc": "2.0", "method": "notifications/message", "params": params}
    request = {"jsonrpc": "2.0", "id": 3, "method": "sampling/createMessage", "params": params}
    request_ts = {"method": "sampling/createMessage", "params": params, "jsonrpc": "2.0", "id": 3}
    lines = [json.dumps(message).encode() for message in (notification, request, request_ts)]

    items = MessageReader(LIMIT).feed(b"\n".join([*lines, b"x" * (4 * LIMIT), answer(4)]) + b"\n")

    assert seen(items)[:4] == [MessageTooLarge] * 4
    assert seen(items)[4]["id"] == 4


def test_a_line_that_goes_on_past_the_bound_gives_the_stream_up_telling_the_request_its_head_names() -> None:
    reader = MessageReader(LIMIT)
    start = answer(5, "")[: -len(b'"}]}}')]
    items = reader.feed(start)
    while not reader.gave_up:
        assert items == []
        items = reader.feed(b"a" * 100)

    assert seen(items) == [too_large(5)]
    assert reader.feed(b'"}]}}\n' + answer(6) + b"\n") == []  # nothing more is read


def test_a_line_past_the_limit_without_an_id_in_its_head_gives_up_with_nothing_to_tell() -> None:
    reader = MessageReader(LIMIT)
    items = reader.feed(b'{"result": {"content": [{"type": "text", "text": "')
    while not reader.gave_up:
        items += reader.feed(b"a" * LIMIT)

    assert seen(items) == [MessageTooLarge]


def test_a_flood_is_read_holding_no_more_than_a_few_limits() -> None:
    limit = 256 * 1024
    reader = MessageReader(limit)
    chunk = b"a" * (64 * 1024)
    tracemalloc.start()
    try:
        reader.feed(answer(1, "")[:-5])
        while not reader.gave_up:
            reader.feed(chunk)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert peak < 4 * limit < SKIP_FACTOR * limit


def test_a_line_that_is_not_utf_8_or_not_json_rpc_is_one_exception_and_the_next_message_is_read() -> None:
    items = MessageReader(LIMIT).feed(b"\xff\xfe not text\n{oops\n" + answer(1) + b"\n")

    assert seen(items)[:2] == [UnicodeDecodeError, type(seen_error(b"{oops"))]
    assert seen(items)[2]["id"] == 1


def seen_error(line: bytes) -> Exception:
    item = MessageReader(LIMIT).feed(line + b"\n")[0]
    assert isinstance(item, Exception)
    return item


STREAM = [
    answer(1),
    answer(2, "b" * (2 * LIMIT)),
    b"not json",
    answer("three", "c" * (3 * LIMIT), id_last=True),
    json.dumps(
        {"jsonrpc": "2.0", "method": "notifications/message", "params": {"data": "d" * LIMIT}}
    ).encode(),
    answer(4, "\u00e9\u4e2d" * 50),
]


@given(st.lists(st.integers(min_value=0, max_value=len(b"\n".join(STREAM)) + 1), max_size=40))
def test_where_the_chunks_of_stdout_end_does_not_change_the_messages(cuts: list[int]) -> None:
    stream = b"\n".join(STREAM) + b"\n"
    bounds = [0, *sorted(set(cuts)), len(stream)]
    reader = MessageReader(LIMIT)
    items = [
        item
        for start, end in zip(bounds, bounds[1:], strict=False)
        for item in reader.feed(stream[start:end])
    ]

    assert seen(items) == seen(MessageReader(LIMIT).feed(stream))
    assert [item.get("id") if isinstance(item, dict) else item for item in seen(items)] == [
        1,
        2,
        type(seen_error(b"not json")),
        "three",
        MessageTooLarge,
        4,
    ]


ids = st.one_of(
    st.integers(),
    st.text(
        st.characters(codec="utf-8", exclude_categories=["Cc", "Cs"], exclude_characters='"\\'), max_size=40
    ),
)
"""JSON writes these without escapes (an id that needs one is not looked for)."""


@given(ids, st.booleans(), st.integers(min_value=0, max_value=5000))
def test_the_id_of_an_answer_is_found_at_either_end_of_it(id: Any, id_last: bool, size: int) -> None:
    line = answer(id, "a" * size, id_last=id_last)

    assert answered_request(line[:4096], line[-1024:]) == id


@given(st.binary(max_size=300), st.binary(max_size=300))
def test_finding_the_id_never_fails_on_any_bytes(head: bytes, tail: bytes) -> None:
    found = answered_request(head, tail)

    assert found is None or isinstance(found, int | str)
