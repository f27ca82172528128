"""The one canonical JSON that every hash is computed over: RFC 8785 (JCS), through `rfc8785`.

RFC 8785 is defined over I-JSON, whose integers fit a double; Writ accepts and records larger ones
(a backend's 64-bit ids), so they are written as their exact digits, the one extension. Everything in
the library's domain is spelled exactly as the library spells it (a property test holds it to that).
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Any

import rfc8785

CanonicalizationError = rfc8785.CanonicalizationError

# Where json.dumps already writes what JCS writes: no float (Python writes 1e-07 and 2.0, JCS 1e-7 and
# 2), and no character from U+D800 up (JCS orders keys by UTF-16 code units, Python by code points; and
# a lone surrogate must be refused). A number follows `":`, `,` or `[`, or starts the text, so these
# three patterns miss none (a timestamp's `:00.0` is not one) but may hit inside a string ("1,250.00
# EUR"): then the strings are taken out and a float is a digit before `.` or `e`. (Three patterns, each
# found by its literal prefix or first character: one alternation tried at every position of the text
# cost more than `json.dumps` itself.)
_AFTER_KEY = re.compile(r'":-?[0-9]+[.eE]')
_IN_LIST = re.compile(r"[,\[]-?[0-9]+[.eE]")
_ALONE = re.compile(r"-?[0-9]+[.eE]")
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_FLOAT = re.compile(r"[0-9][.eE]")
_HIGH = re.compile("[\ud800-\U0010ffff]")
_INT_LIMIT = 2**53 - 1


def canonical_json(value: Any) -> str:
    """RFC 8785 canonical JSON of `value`, integers of any size written exactly.

    Raises:
        CanonicalizationError: `value` is not JSON: NaN or infinity, a lone surrogate, a key that is
            not a string, a type JSON has no form for.
    """
    try:
        # json.dumps is C and several times faster; most values hashed here hold no float.
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        text = None
    # `isascii` is a flag the string carries: no search at all for the usual all-ASCII text.
    if text is not None and (text.isascii() or not _HIGH.search(text)) and not _has_float(text):
        return text
    try:
        return rfc8785.dumps(value).decode("utf-8")
    except rfc8785.IntegerDomainError:
        return _with_wide_integers(value)
    except UnicodeEncodeError as exc:  # a lone surrogate in a key, which the library sorts by UTF-16
        raise CanonicalizationError("a key holds a lone surrogate, which has no UTF-8 form") from exc


def _has_float(text: str) -> bool:
    maybe = _AFTER_KEY.search(text) or _IN_LIST.search(text) or _ALONE.match(text)
    return maybe is not None and _FLOAT.search(_STRING.sub("", text)) is not None


def _with_wide_integers(value: Any) -> str:
    # Each integer outside the double's range goes through the library as a string tagged with a
    # random nonce, then the quoted tag is replaced by the digits: key order and every other value
    # stay the library's. The count guards against the nonce occurring in the value itself.
    nonce = secrets.token_hex(16)
    found = 0

    def tag(item: Any) -> Any:
        nonlocal found
        if isinstance(item, int) and not isinstance(item, bool) and abs(item) > _INT_LIMIT:
            found += 1
            return f"{nonce}{item}"
        if isinstance(item, dict):
            return {key: tag(inner) for key, inner in item.items()}
        if isinstance(item, list | tuple):
            return [tag(inner) for inner in item]
        return item

    text = rfc8785.dumps(tag(value)).decode("utf-8")
    if text.count(nonce) != found:
        raise CanonicalizationError("the value holds the canonicalizer's nonce")
    return re.sub(f'"{nonce}(-?[0-9]+)"', r"\1", text)


def legacy_json(value: Any) -> str:
    """The spelling hashed before RFC 8785 (events of schema_version 1, hashes taken then)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
