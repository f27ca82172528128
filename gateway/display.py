"""Text for a person to judge: characters that are invisible or reorder text are shown as code points.

An approver decides on what they see. A bidi override (U+202E) in an argument displays `\u202eevil`
as "live" and `\u202e2001` as "1002"; a zero-width space or a tag character is not seen at all. Every
value the console or the CLI shows a person goes through `visible`, so what they read is what is sent.
"""

from __future__ import annotations

import json
import unicodedata
from typing import Any

# Cc: controls (NUL, ESC, ...); Cf: format (bidi embeddings, overrides and isolates, zero-width
# characters, tags); Zl, Zp: line and paragraph separators. Tab and newline stay as they are.
_HIDDEN = frozenset({"Cc", "Cf", "Zl", "Zp"})
_KEPT = frozenset("\t\n")


def visible(value: Any) -> Any:
    """A string (or a JSON object/array, as JSON text) with hidden characters as `<U+XXXX>`; other
    values unchanged."""
    if isinstance(value, dict | list):
        value = json.dumps(value, ensure_ascii=False, sort_keys=True)
    if not isinstance(value, str) or value.isascii() and value.isprintable():
        return value
    return "".join(
        f"<U+{ord(ch):04X}>" if ch not in _KEPT and unicodedata.category(ch) in _HIDDEN else ch
        for ch in value
    )
