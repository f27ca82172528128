"""What a person is shown of a value: nothing hidden, nothing reordered, everything else as it is."""

from __future__ import annotations

import unicodedata

from hypothesis import given
from hypothesis import strategies as st

from gateway.display import visible


def test_bidi_controls_zero_width_and_control_characters_become_code_points() -> None:
    assert visible("\u202e2001") == "<U+202E>2001"
    assert visible("a\u200bb\u2066c\u2069") == "a<U+200B>b<U+2066>c<U+2069>"
    assert visible("\x1b[31mred\x00") == "<U+001B>[31mred<U+0000>"
    assert visible("tag\U000e0041") == "tag<U+E0041>"


def test_ordinary_text_numbers_and_none_are_unchanged_and_objects_are_json() -> None:
    assert visible("refund 250 EUR, naïve ﷽ 👍🏽\tok\n") == "refund 250 EUR, naïve ﷽ 👍🏽\tok\n"
    assert visible(250) == 250 and visible(None) is None
    assert visible({"b": ["\u202e"], "a": 1}) == '{"a": 1, "b": ["<U+202E>"]}'


@given(st.text())
def test_no_hidden_character_survives(text: str) -> None:
    shown = visible(text)
    assert all(ch in "\t\n" or unicodedata.category(ch) not in {"Cc", "Cf", "Zl", "Zp"} for ch in shown)
