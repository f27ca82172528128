"""Which resource URIs Writ refuses to read: those an upstream could resolve to another than policy saw."""

from __future__ import annotations

import re

from capabilities.contract import NAME_CHARS

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")
# A segment ends at `/`, and at `?` or `#` too: `file:///public/..?x` is `/public/..` to a URL parser.
_SEGMENT_END = re.compile(r"[/?#]")
_ENCODED_DOT = re.compile(r"%2e", re.IGNORECASE)
_ENCODED_SEPARATOR = re.compile(r"%(2f|5c)", re.IGNORECASE)


def uri_problem(uri: str, prefix: str = "") -> str | None:
    """Why Writ refuses to read `uri` (shown with `prefix`, which it loses upstream), or None.

    A rule's URI pattern is matched against the URI as written (`*` crosses `/`), while the upstream
    may resolve `..` as a path does: `file:///public/../etc/passwd` matches `file:///public/*` and
    reads `/etc/passwd`. So a URI that an upstream could resolve to another is refused, never
    normalised (which would read what the caller did not ask for): one with a dot-segment (`.` or `..`,
    also percent-encoded), an encoded `/` or `\\` (`%2F`, `%5C`) that could be decoded into one, or
    a `\\`, which no URI holds unencoded (RFC 3986) and which URL parsers (WHATWG, for `file:`
    and `http:`) and Windows paths take for `/`. Segments are looked for in the whole URI, query and
    fragment too: Writ does not know how an upstream parses its scheme, and `*` crosses `?` and `#`.
    """
    if len(uri) > NAME_CHARS:  # recorded as the read's tool name: PostgreSQL would refuse it after the read
        return f"it is {len(uri)} characters long, over the {NAME_CHARS} Writ can record"
    if "\\" in uri:
        return "it holds a backslash ('\\'), which an upstream may take for '/'"
    if found := _ENCODED_SEPARATOR.search(uri):
        return f"it holds an encoded separator ({found.group(0)!r}), which an upstream may decode into a path"
    # As Writ shows it and as the upstream gets it: `lib+../x` is `../x` upstream.
    for each in {uri, uri.removeprefix(prefix)}:
        scheme = _SCHEME.match(each)
        for segment in _SEGMENT_END.split(each[scheme.end() if scheme else 0 :]):
            if _ENCODED_DOT.sub(".", segment) in (".", ".."):
                return f"its path holds the dot-segment {segment!r}, which an upstream may resolve"
    return None
