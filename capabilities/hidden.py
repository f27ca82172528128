"""Characters that are invisible or reorder text: what a reader cannot see, or sees other than it is.

A bidi override (U+202E) displays `\u202eevil` as "live"; a zero-width space, a variation selector, a
tag character or a Hangul filler is not seen at all. The gateway shows such characters as code points
to the people who judge calls (`gateway.display`); what upstreams name and describe is checked for
them too.
"""

from __future__ import annotations

import unicodedata
from bisect import bisect_right

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


def is_hidden(ch: str) -> bool:
    """Whether the character `ch` is a control, format (bidi, zero-width, tag), line or paragraph
    separator, default-ignorable or blank character."""
    if unicodedata.category(ch) in _HIDDEN:
        return True
    at = bisect_right(_STARTS, ord(ch)) - 1
    return at >= 0 and ord(ch) <= _RANGES[at][1]


LINE_BREAKS_KEPT = frozenset("\t\n")
"""What a text of several lines keeps as it is: tab and newline (a list row keeps the tab alone)."""


def marked(text: str, kept: frozenset[str] = frozenset()) -> str:
    """`text` with every hidden character but those `kept` as `<U+XXXX>`."""
    if text.isascii() and text.isprintable():
        return text
    return "".join(f"<U+{ord(ch):04X}>" if ch not in kept and is_hidden(ch) else ch for ch in text)
