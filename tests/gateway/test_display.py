"""What a person is shown of a value: nothing hidden, nothing reordered, everything else as it is."""

from __future__ import annotations

import unicodedata

from hypothesis import given
from hypothesis import strategies as st

from gateway.display import visible, visible_line

# Default_Ignorable_Code_Point (Unicode 14.0) beyond the bidi, zero-width and tag characters, and
# U+2800: each renders as nothing or as blank, so "1002\ufe0f" read as "1002". Most are not Cf.
SHOWN_AS_NOTHING_OR_BLANK = (
    "\u034f",  # combining grapheme joiner
    "\u115f\u1160\u3164\uffa0",  # Hangul fillers
    "\u17b4\u17b5",  # Khmer inherent vowels
    "\u180b\u180c\u180d\u180f",  # Mongolian free variation selectors
    "\u2065",  # reserved, default ignorable
    "".join(map(chr, range(0xFE00, 0xFE10))),  # variation selectors 1-16
    "".join(map(chr, range(0xFFF0, 0xFFF9))),  # reserved, default ignorable
    "".join(map(chr, range(0x1D173, 0x1D17B))),  # musical beam and phrase controls
    "".join(map(chr, range(0xE0100, 0xE01F0))),  # variation selectors 17-256
    "\U000e0000\U000e0002\U000e0080\U000e01f0\U000e0fff",  # reserved tags and selectors
    "\u2800",  # braille pattern blank
)

UNSEEN = frozenset("".join(SHOWN_AS_NOTHING_OR_BLANK))
LINE_BREAKS = "\n\r\v\f\x85\u2028\u2029"
# Any text, with what must be marked drawn far more often than st.characters() alone would.
TEXT = st.text(st.characters() | st.sampled_from(sorted(UNSEEN)) | st.sampled_from(LINE_BREAKS))

ORDINARY = (
    "refund 250 EUR, naïve ﷽ 👍🏽\tok\n",
    "Ærøskøbing, façade, Łódź, Ελληνικά, Кириллица",
    "漢字かなカナ 中文 订单",
    "العربية طلب استرداد",
    "עברית החזר",
    "한국어 환불 주문",
    "🎉👍🚀 ☕",
)


def test_bidi_controls_zero_width_and_control_characters_become_code_points() -> None:
    assert visible("\u202e2001") == "<U+202E>2001"
    assert visible("a\u200bb\u2066c\u2069") == "a<U+200B>b<U+2066>c<U+2069>"
    assert visible("\x1b[31mred\x00") == "<U+001B>[31mred<U+0000>"
    assert visible("tag\U000e0041") == "tag<U+E0041>"


def test_variation_selectors_and_hangul_fillers_become_code_points() -> None:
    assert visible("1002\ufe0f") == "1002<U+FE0F>"
    assert visible("dup\u3164check") == "dup<U+3164>check"
    assert visible("a\u034fb\U000e0100") == "a<U+034F>b<U+E0100>"


def test_every_character_that_renders_as_nothing_or_blank_becomes_a_code_point() -> None:
    for ch in sorted(UNSEEN):
        assert visible(f"a{ch}b") == f"a<U+{ord(ch):04X}>b"
        assert visible_line(ch) == f"<U+{ord(ch):04X}>"


def test_ordinary_text_numbers_and_none_are_unchanged_and_objects_are_json() -> None:
    assert visible("refund 250 EUR, naïve ﷽ 👍🏽\tok\n") == "refund 250 EUR, naïve ﷽ 👍🏽\tok\n"
    assert visible(250) == 250 and visible(None) is None
    assert visible({"b": ["\u202e"], "a": 1}) == '{"a": 1, "b": ["<U+202E>"]}'


def test_ordinary_text_in_many_scripts_is_unchanged_on_a_page_and_in_a_line() -> None:
    for text in ORDINARY:
        assert visible(text) == text
        assert visible_line(text) == text.replace("\n", "<U+000A>")


def test_a_line_shows_every_line_break_as_a_code_point_and_keeps_tabs() -> None:
    shown = visible_line("1002\nap_x  awaiting refund 5 EUR\r\v\f\x85\u2028\u2029\x1c\x1d\x1e\tend")
    assert shown == (
        "1002<U+000A>ap_x  awaiting refund 5 EUR"
        "<U+000D><U+000B><U+000C><U+0085><U+2028><U+2029><U+001C><U+001D><U+001E>\tend"
    )
    assert visible("a\nb") == "a\nb"  # a page may keep its newlines
    assert visible_line({"a": "x\ny"}) == '{"a": "x\\ny"}'  # JSON text has its newlines escaped


@given(TEXT)
def test_no_hidden_character_survives(text: str) -> None:
    shown = visible(text)
    assert all(ch in "\t\n" or unicodedata.category(ch) not in {"Cc", "Cf", "Zl", "Zp"} for ch in shown)
    assert not UNSEEN & set(shown)


@given(TEXT)
def test_a_line_never_breaks(text: str) -> None:
    assert len(str(visible_line(text)).splitlines()) <= 1
