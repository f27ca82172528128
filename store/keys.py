"""The idempotency key a backend gets: the client's key, scoped to the principal who sent it.

Inside Writ a key is each principal's own: the effect ledger holds (tenant, subject, key). A backend
holds every principal's keys in one space, so two agents that happen to pick the same key would share
one effect there: a backend that deduplicates on the key would answer the second refund with the
first one's, and a lookup by key would find either one's record. Writ therefore sends
`<client key>~<tag>`, where the tag names the principal and nothing of it can be read back:

    refund-1001~<20 hex digits>      (the first 80 bits of a SHA-256 of tenant and subject)

The client's key stays readable, so an operator finds a call's record at the backend by it. `~` and hex
digits are unreserved in URIs (RFC 3986 §2.3), so the key goes unchanged into headers, paths, query
strings and JSON. A client's key is at most 255 characters (`gateway.mcp.server`), so a backend gets
at most 276. Hex rather than base32: the stored `tool_call.dispatching` payload is deflated with the
hex of the ids beside it, and 20 hex digits pack into about 7 bytes fewer than 16 base32 characters.

`tool_call.dispatching` records the key as sent; `tool_call.requested` and the effect ledger keep the
client's. A call dispatched before keys were scoped recorded the client's key there, and its lookups
and re-sends keep using it (`CallView.key_scoped`).
"""

from __future__ import annotations

import functools
import hashlib

SCOPE_SEPARATOR = "~"
TAG_CHARS = 20
"""80 bits: among a million principals, the chance that any two share a tag is about 4 in 10^13."""
_DOMAIN = b"writ/key-scope\0"


def scoped_key(tenant: str, subject: str, key: str) -> str:
    """`key` as a backend gets it from `subject` of `tenant`: `<key>~<tag>`."""
    return f"{key}{SCOPE_SEPARATOR}{principal_tag(tenant, subject)}"


def sent_key(tenant: str, subject: str, key: str, *, scoped: bool) -> str:
    """The key a dispatch sent: scoped, or `key` itself for one dispatched before keys were scoped."""
    return scoped_key(tenant, subject, key) if scoped else key


@functools.lru_cache(maxsize=4096)
def principal_tag(tenant: str, subject: str) -> str:
    """The principal's tag: the first 20 lowercase hex digits of SHA-256 over an injective encoding of
    (tenant, subject), each length-prefixed, so that no two principals share one encoding however their
    names are spelt (("a\\0b", "c") and ("a", "b\\0c") differ)."""
    return hashlib.sha256(_DOMAIN + _field(tenant) + _field(subject)).hexdigest()[:TAG_CHARS]


def _field(text: str) -> bytes:
    # `surrogatepass`: a subject is whatever string a token's claim held, a lone surrogate too.
    data = text.encode("utf-8", "surrogatepass")
    return len(data).to_bytes(8, "big") + data
