"""JSON pointers (RFC 6901), as lookups declare where their records and states are."""

from __future__ import annotations

import pytest

from capabilities.pointers import ABSENT, escape_token, parse_pointer, resolve

DOC = {"foo": ["bar", "baz"], "": 0, "a/b": 1, "m~n": 8, "k": {"0": "zero"}, "n": None}


@pytest.mark.parametrize(
    ("pointer", "expected"),
    [
        ("", DOC),
        ("/foo", ["bar", "baz"]),
        ("/foo/0", "bar"),
        ("/", 0),
        ("/a~1b", 1),
        ("/m~0n", 8),
        ("/k/0", "zero"),  # an object's member named "0"
        ("/n", None),  # null is there: not absent
    ],
)
def test_the_rfc_6901_examples_resolve(pointer: str, expected: object) -> None:
    assert resolve(DOC, pointer) == expected


@pytest.mark.parametrize("pointer", ["/missing", "/foo/2", "/foo/-", "/foo/01", "/foo/x", "/a~1b/c", "/n/x"])
def test_what_a_pointer_does_not_reach_is_absent(pointer: str) -> None:
    assert resolve(DOC, pointer) is ABSENT


@pytest.mark.parametrize(
    ("pointer", "message"),
    [("refunds", "must start with '/'"), ("/a~2", "'~' must be followed by 0 or 1"), ("/a~", "'~' must")],
)
def test_a_malformed_pointer_is_refused_saying_why(pointer: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_pointer(pointer)


def test_an_escaped_name_is_found_again_by_its_pointer() -> None:
    for name in ("a/b", "m~n", "~1", "/~"):
        assert resolve({name: 1}, "/" + escape_token(name)) == 1
