"""Text for a person to judge: characters that are invisible or reorder text are shown as code points.

An approver decides on what they see. A bidi override (U+202E) in an argument displays `\u202eevil`
as "live" and `\u202e2001` as "1002"; a zero-width space, a variation selector or a Hangul filler is
not seen at all. Every value the console or the CLI shows a person goes through `visible`, so what
they read is what is sent; a row of a list goes through `visible_line`, so one value cannot start a
row of its own.
"""

from __future__ import annotations

import json
from typing import Any

from capabilities.hidden import LINE_BREAKS_KEPT, marked

# A list row is one line: a newline in a value would start a row of its own (the other line breaks
# Python and terminals know, \r \v \f U+0085 U+2028 U+2029, are Cc, Zl or Zp and marked anyway).
_KEPT_IN_LINE = frozenset("\t")


def _shown(value: Any, kept: frozenset[str]) -> Any:
    if isinstance(value, dict | list):
        value = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return marked(value, kept) if isinstance(value, str) else value


def visible(value: Any) -> Any:
    """A string (or a JSON object/array, as JSON text) with hidden characters as `<U+XXXX>`, tab and
    newline kept; other values unchanged."""
    return _shown(value, LINE_BREAKS_KEPT)


def visible_line(value: Any) -> Any:
    """As `visible`, with a newline too as `<U+000A>`: for one row of a list, which a value must not
    break into two."""
    return _shown(value, _KEPT_IN_LINE)
