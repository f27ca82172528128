"""Which resource URIs Writ refuses to read: those an upstream could resolve to another than policy saw.

A rule's URI pattern is matched against the URI as written (`*` crosses `/`), while the upstream may
resolve `..` as a path does: `file:///public/../etc/passwd` matches `file:///public/*` and reads
`/etc/passwd`. Writ does not know how an upstream reads its URIs, so it checks every reading an upstream
plausibly makes, and refuses the URI when any of them could name another resource. Normalising it
instead would read what the caller did not ask for.

The readings are the URI as written and what it becomes percent-decoded once, twice, ... until it no
longer changes (an upstream that decodes twice reads `%252e%252e` as `..`), each also in Unicode NFKC
(which reads a fullwidth `．．` as `..`). In none of them may there be:

- a dot-segment: a segment (between `/`, `?` and `#`, in the query and fragment too, since `*` crosses
  them and Writ does not know the upstream's scheme) whose part before any `;` (a path parameter, which
  Tomcat-style servers drop: `..;x` is `..`) is `.` or `..` once characters a person cannot see are
  left out and white space is trimmed (`.. `, `.\u200b.`). `..b` and `...` are names like any other;
- an encoded separator (`%2F`, `%5C`), which a decoding upstream makes a path of; or a backslash,
  which no URI holds unencoded (RFC 3986) and which URL parsers (WHATWG, for `file:` and `http:`) and
  Windows paths take for `/`;
- a control character (`%00`, a tab or newline, which WHATWG parsers drop from a URL);
- percent-encoded bytes that are not UTF-8, which Writ cannot read and an upstream may (an overlong
  `%C0%AE` is `.` to a lenient decoder).

Double encoding of anything else is let through: `%2541` is a literal `%41` to an upstream that decodes
once and `A` to one that decodes twice, and neither is a path elsewhere.
"""

from __future__ import annotations

import re
import unicodedata
from urllib.parse import unquote_to_bytes

from capabilities.contract import NAME_CHARS
from capabilities.hidden import is_hidden

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")
# A segment ends at `/`, and at `?` or `#` too: `file:///public/..?x` is `/public/..` to a URL parser.
_SEGMENT_END = re.compile(r"[/?#]")
_ENCODED_SEPARATOR = re.compile(r"%(2f|5c)", re.IGNORECASE)
_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")
_MAX_READINGS = 256
"""Readings checked at most; a URI with more is refused. One of 256 ASCII characters has at most 128
(`%2525...2e`, one layer a decoding); only NFKC, of characters it changes, makes more."""


class _NotUtf8(ValueError):
    pass


def uri_problem(uri: str, prefix: str = "") -> str | None:
    """Why Writ refuses to read `uri` (shown with `prefix`, which it loses upstream), or None."""
    if len(uri) > NAME_CHARS:  # recorded as the read's tool name: PostgreSQL would refuse it after the read
        return f"it is {len(uri)} characters long, over the {NAME_CHARS} Writ can record"
    if surrogate := next((ch for ch in uri if unicodedata.category(ch) == "Cs"), None):
        return f"it holds the lone surrogate U+{ord(surrogate):04X}, which is no character"
    # As Writ shows it and as the upstream gets it: `lib+../x` is `../x` upstream.
    for each in dict.fromkeys((uri, uri.removeprefix(prefix))):
        try:
            readings = _readings(each)
        except _NotUtf8 as exc:
            return (
                f"it holds percent-encoded bytes that are not UTF-8 ({exc}), which an upstream may decode "
                "otherwise"
            )
        if readings is None:
            return "it is encoded in more ways than Writ checks"
        for reading in readings:
            if problem := _reading_problem(reading, decoded=reading != each):
                return problem
    return None


def _readings(uri: str) -> list[str] | None:
    """`uri` as an upstream may read it: as written, percent-decoded again and again, and in NFKC, in
    any order; None when there are more than Writ checks.

    Raises:
        _NotUtf8: a reading percent-decodes to bytes that are not UTF-8.
    """
    readings: dict[str, None] = {}
    todo = [uri]
    while todo:
        text = todo.pop()
        if text in readings:
            continue
        if len(readings) == _MAX_READINGS:
            return None
        readings[text] = None
        todo += [_decoded(text), unicodedata.normalize("NFKC", text)]
    return list(readings)


def _decoded(text: str) -> str:
    if not _ESCAPE.search(text):
        return text
    try:
        return unquote_to_bytes(text).decode()
    except UnicodeDecodeError:
        raise _NotUtf8(" ".join(e for e in _ESCAPE.findall(text) if int(e[1:], 16) >= 0x80)) from None


def _reading_problem(reading: str, *, decoded: bool) -> str | None:
    read = " once decoded or normalised" if decoded else ""
    if "\\" in reading:
        return f"it holds a backslash ('\\'){read}, which an upstream may take for '/'"
    if found := _ENCODED_SEPARATOR.search(reading):
        separator = found.group(0)
        return (
            f"it holds an encoded separator ({separator!r}){read}, which an upstream may decode into a path"
        )
    if control := next((ch for ch in reading if unicodedata.category(ch) == "Cc"), None):
        return (
            f"it holds the control character U+{ord(control):04X}{read}, which an upstream may drop or cut at"
        )
    scheme = _SCHEME.match(reading)
    for segment in _SEGMENT_END.split(reading[scheme.end() if scheme else 0 :]):
        if _is_dot_segment(segment):
            return f"its path holds the dot-segment {segment!r}{read}, which an upstream may resolve"
    return None


def _is_dot_segment(segment: str) -> bool:
    # Before a `;`: Tomcat and other servlet containers drop path parameters, so `..;x` is `..` to them.
    name = segment.split(";", 1)[0]
    return "".join(ch for ch in name if not is_hidden(ch)).strip() in (".", "..")
