"""Canonical JSON is RFC 8785's, integers of any size exact, and stable through a store round trip."""

from __future__ import annotations

import json
import re
import struct
from typing import Any

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from store.canonical import _AFTER_KEY, _ALONE, _IN_LIST, CanonicalizationError, canonical_json, legacy_json

SAFE = 2**53 - 1


def _json(ints: st.SearchStrategy[int]) -> st.SearchStrategy[Any]:
    scalars = st.none() | st.booleans() | ints | st.floats(allow_nan=False, allow_infinity=False) | st.text()
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
        max_leaves=20,
    )


I_JSON = _json(st.integers(-SAFE, SAFE))
# Python reads no integer past 4300 digits from JSON text, so none can reach a hash.
WIDE = st.integers(-(10**300), 10**300)
ANY_JSON = _json(WIDE)


def test_rfc8785_s3_2_2_example_is_spelled_as_the_rfc_spells_it() -> None:
    value = json.loads(
        '{"numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],'
        ' "string": "\\u20ac$\\u000F\\u000aA\'\\u0042\\u0022\\u005c\\\\\\"\\/",'
        ' "literals": [null, true, false]}'
    )

    assert canonical_json(value) == (
        '{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],'
        '"string":"€$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}'
    )


def test_rfc8785_s3_2_3_keys_sort_by_utf16_code_units() -> None:
    value = {"\u20ac": 1, "\r": 2, "\ufb33": 3, "1": 4, "\U0001f600": 5, "\u0080": 6, "\u00f6": 7}

    assert list(json.loads(canonical_json(value))) == [
        "\r",
        "1",
        "\u0080",
        "\u00f6",
        "\u20ac",
        "\U0001f600",
        "\ufb33",
    ]


@pytest.mark.parametrize(
    ("bits", "spelled"),
    [
        ("0000000000000000", "0"),
        ("8000000000000000", "0"),
        ("0000000000000001", "5e-324"),
        ("8000000000000001", "-5e-324"),
        ("7fefffffffffffff", "1.7976931348623157e+308"),
        ("ffefffffffffffff", "-1.7976931348623157e+308"),
        ("4340000000000000", "9007199254740992"),
        ("c340000000000000", "-9007199254740992"),
        ("4430000000000000", "295147905179352830000"),
        ("44b52d02c7e14af5", "9.999999999999997e+22"),
        ("44b52d02c7e14af6", "1e+23"),
        ("44b52d02c7e14af7", "1.0000000000000001e+23"),
        ("444b1ae4d6e2ef4e", "999999999999999700000"),
        ("444b1ae4d6e2ef4f", "999999999999999900000"),
        ("444b1ae4d6e2ef50", "1e+21"),
        ("3eb0c6f7a0b5ed8c", "9.999999999999997e-7"),
        ("3eb0c6f7a0b5ed8d", "0.000001"),
        ("41b3de4355555553", "333333333.3333332"),
        ("41b3de4355555554", "333333333.33333325"),
        ("41b3de4355555555", "333333333.3333333"),
        ("41b3de4355555556", "333333333.3333334"),
        ("41b3de4355555557", "333333333.33333343"),
        ("becbf647612f3696", "-0.0000033333333333333333"),
        ("43143ff3c1cb0959", "1424953923781206.2"),
    ],
)
def test_rfc8785_appendix_b_numbers_are_spelled_as_the_rfc_spells_them(bits: str, spelled: str) -> None:
    (number,) = struct.unpack(">d", bytes.fromhex(bits))

    assert canonical_json(number) == spelled
    assert canonical_json([number]) == f"[{spelled}]"


@settings(deadline=None)
@given(I_JSON)
def test_every_i_json_value_is_spelled_exactly_as_the_rfc8785_library_spells_it(value: Any) -> None:
    assert canonical_json(value) == rfc8785.dumps(value).decode("utf-8")


@settings(deadline=None)
@given(ANY_JSON)
def test_a_canonical_text_read_back_is_spelled_the_same_again(value: Any) -> None:
    # What the store keeps is the canonical text; reading it back and hashing it again must agree,
    # though 2.0 reads back as 2 and 1e20 as an integer too wide for a double.
    text = canonical_json(value)

    assert canonical_json(json.loads(text)) == text


@settings(deadline=None)
@given(WIDE.filter(lambda n: abs(n) > SAFE))
def test_integers_too_wide_for_a_double_are_written_as_their_exact_digits(number: int) -> None:
    assert canonical_json({"id": number, "f": 0.5}) == f'{{"f":0.5,"id":{number}}}'
    assert canonical_json({"id": number + 1}) != canonical_json({"id": number})


@pytest.mark.parametrize(
    "value",
    [float("nan"), [float("inf")], {"a": float("-inf")}, "\ud800", {"\udfff": 1}, {1: "a", "b": 2}, object()],
    ids=["nan", "infinity", "minus-infinity", "surrogate", "surrogate-key", "non-string-key", "object"],
)
def test_values_that_are_not_json_are_refused(value: Any) -> None:
    with pytest.raises(CanonicalizationError):
        canonical_json(value)


def test_the_legacy_spelling_is_what_schema_version_1_hashed() -> None:
    assert legacy_json({"b": 30.0, "a": 1e-7, "c": "späť"}) == '{"a":1e-07,"b":30.0,"c":"späť"}'
    assert canonical_json({"b": 30.0, "a": 1e-7, "c": "späť"}) == '{"a":1e-7,"b":30,"c":"späť"}'


@pytest.mark.parametrize(
    "value",
    [
        {"summary": "refund 1,250.00 EUR", "at": "2026-01-01T00:00:00.500000Z", "q": '":1.5', "n": [1, 2]},
        {"amount": 250.5, "summary": "refund 250.50 EUR"},
        [1e-7, "1e-7", 30.0],
        12.5,
    ],
    ids=["numbers-in-strings", "float-value", "floats-in-an-array", "top-level-float"],
)
def test_floats_are_found_wherever_they_are_and_only_there(value: Any) -> None:
    assert canonical_json(value) == rfc8785.dumps(value).decode("utf-8")


# The one pattern the three searches of `store.canonical` replaced (for speed): they must agree.
_ONE_ALTERNATION = re.compile(r'(?:^|":|[,\[])-?[0-9]+[.eE]')


@given(
    ANY_JSON.map(lambda v: json.dumps(v, sort_keys=True, separators=(",", ":")))
    | st.text('0123456789.eE-":,[]{} a')
)
def test_the_three_searches_for_a_number_that_may_be_a_float_find_what_one_alternation_found(
    text: str,
) -> None:
    split = _AFTER_KEY.search(text) or _IN_LIST.search(text) or _ALONE.match(text)
    assert (split is not None) == (_ONE_ALTERNATION.search(text) is not None)
