"""Text for a person to judge: characters that are invisible or reorder text are shown as code points.

An approver decides on what they see. A bidi override (U+202E) in an argument displays `\u202eevil`
as "live" and `\u202e2001` as "1002"; a zero-width space, a variation selector or a Hangul filler is
not seen at all. Every value the console or the CLI shows a person goes through `visible`, so what
they read is what is sent; a row of a list goes through `visible_line`, so one value cannot start a
row of its own.
"""

from __future__ import annotations

import json
import unicodedata
from bisect import bisect_right
from typing import Any

# Cc: controls (NUL, ESC, ...); Cf: format (bidi embeddings, overrides and isolates, zero-width
# characters, tags); Zl, Zp: line and paragraph separators.
_HIDDEN = frozenset({"Cc", "Cf", "Zl", "Zp"})

# Default_Ignorable_Code_Point from DerivedCoreProperties.txt of Unicode 14.0.0, the version of
# Python 3.11's `unicodedata` (which has no such property): what a renderer shows as nothing when it
# has no glyph for it. Many are Cf and caught by category already; the rest are marks and letters that
# show as nothing (U+034F combining grapheme joiner, U+115F/U+1160/U+3164/U+FFA0 Hangul fillers,
# U+17B4/U+17B5 Khmer inherent vowels, Mongolian and other variation selectors) and unassigned code
# points reserved to be ignorable (U+2065, U+FFF0..FFF8, most of U+E0000..E0FFF). Inclusive ranges.
_DEFAULT_IGNORABLE = (
    (0x00AD, 0x00AD),
    (0x034F, 0x034F),
    (0x061C, 0x061C),
    (0x115F, 0x1160),
    (0x17B4, 0x17B5),
    (0x180B, 0x180F),
    (0x200B, 0x200F),
    (0x202A, 0x202E),
    (0x2060, 0x206F),
    (0x3164, 0x3164),
    (0xFE00, 0xFE0F),
    (0xFEFF, 0xFEFF),
    (0xFFA0, 0xFFA0),
    (0xFFF0, 0xFFF8),
    (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF),
)
# Not default-ignorable, so a renderer draws it, but what it draws is blank: U+2800 braille pattern
# blank (a symbol, So, with no dots) reads as a space in an argument without being one. Spaces
# proper (Zs) stay as they are; they read as the space they are.
_BLANK = ((0x2800, 0x2800),)
_RANGES = tuple(sorted(_DEFAULT_IGNORABLE + _BLANK))
_STARTS = tuple(lo for lo, _ in _RANGES)

_KEPT = frozenset("\t\n")
# A list row is one line: a newline in a value would start a row of its own (the other line breaks
# Python and terminals know, \r \v \f U+0085 U+2028 U+2029, are Cc, Zl or Zp and marked anyway).
_KEPT_IN_LINE = frozenset("\t")


def _hidden(ch: str) -> bool:
    if unicodedata.category(ch) in _HIDDEN:
        return True
    at = bisect_right(_STARTS, ord(ch)) - 1
    return at >= 0 and ord(ch) <= _RANGES[at][1]


def _shown(value: Any, kept: frozenset[str]) -> Any:
    if isinstance(value, dict | list):
        value = json.dumps(value, ensure_ascii=False, sort_keys=True)
    if not isinstance(value, str) or value.isascii() and value.isprintable():
        return value
    return "".join(f"<U+{ord(ch):04X}>" if ch not in kept and _hidden(ch) else ch for ch in value)


def visible(value: Any) -> Any:
    """A string (or a JSON object/array, as JSON text) with hidden characters as `<U+XXXX>`, tab and
    newline kept; other values unchanged."""
    return _shown(value, _KEPT)


def visible_line(value: Any) -> Any:
    """As `visible`, with a newline too as `<U+000A>`: for one row of a list, which a value must not
    break into two."""
    return _shown(value, _KEPT_IN_LINE)
