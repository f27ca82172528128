"""JSON text stored deflated against a preset dictionary: the same text back, in about a third of the bytes.

An event's payload is a few hundred bytes of canonical JSON, most of it key names and values every
event of its type repeats (`"charges":null`, `"lease_owner":"writ-gateway"`, the MCP result's
`{"content":[{"text":...,"type":"text"}]`). zlib alone gains little on so short a text: it has nothing
to refer back to. Primed with a dictionary of those repeated parts (RFC 1951's window, filled before
the text as `zlib`'s `zdict`), a `tool_call.requested` of 810 bytes packs into about 230.

What is packed is exactly the text: unpacking gives back the very characters that were hashed, so
each event's hash and the log's chain are computed and checked over the canonical JSON as before.

The stored form names its spelling by its first byte: `0x01` is raw deflate (no zlib header or
checksum: the event's hash covers the text) primed with `DICTIONARY_1`; `0x02` the same primed with
`DICTIONARY_2`, of the text with its embedded JSON written out (below); anything else is the text's
UTF-8 as it is (rows written before packing, or a text that packing would not make shorter). JSON
text never starts with byte 0x01 or 0x02. A later dictionary gets a new first byte: the bytes of
`DICTIONARY_1` and `DICTIONARY_2` are a storage format, never to be edited.

Embedded JSON: an MCP tool's result carries its structured answer twice, as `structuredContent` and
as the JSON text of its `text` content, a string in which every quote is escaped (`{\\"amount\\":0.01`),
so deflate finds nothing of one in the other. Form 0x02 writes each string that holds an escaped quote
out as the text it stands for, between bytes 0x02 and 0x03 (which JSON text never holds raw), when
JSON's escaping gives back exactly that string: the two copies then share their key names and values.
Unpacking escapes it again. A refund's result packs into about 50 bytes fewer (issue 16 item 8).
"""

from __future__ import annotations

import functools
import re
import zlib
from _json import encode_basestring, scanstring
from functools import lru_cache

PACKED_1 = 1
"""The first byte of a text deflated against `DICTIONARY_1`."""

# Parts of the JSON the store writes per call, least repeated first: deflate codes a match nearer
# the end of the window in fewer bits. Key names in canonical (sorted) order, as they are stored.
DICTIONARY_1 = (
    b'{"break_glass":false,"decided_by":"","decided_by_roles":null,"reason":null,"withdrawn":null}'
    b'{"action_hash":"","approver_role":"","expires_at":"","requester":"","requester_may_approve":false}'
    b'{"attempt":1,"fencing_token":1,"lease_expires_at":"","lease_owner":"writ-gateway","method":""}'
    b'{"break_glass":false,"detail":null,"evidence":{},"reason":null,"resolved_by":null,"result":null,'
    b'"verdict":"confirmed_failure"}{"detail":null,"error":"","evidence":{},"reconciliation":"pending"}'
    b'"approval":{"approver_role":"","expires_in_s":3600,"requester_may_approve":false},'
    b'"structuredContent":{"_meta":{"writ/toolCallId":"'
    b'"charges":[{"amount_micros":,"budget":"","key":"","resets_at":"","window_start":""}],'
    b'"loops":[{"key":"","resets_at":"","rule":"","window_start":""}],'
    b'"trace_context":{"traceparent":"00-'
    b'{"client_id":"","groups":[],"roles":[],"scopes":[],"subject":"","tenant":"default"}'
    b'"decision":{"approval":null,"effect":"allow","message":null,"policy_version":"","reason":"",'
    b'"rule_id":""},"dedupe_window_s":600,"effect_class":"write","external_request_id":"ext-",'
    b'"idempotency_key":"derived:","key_source":"derived","loops":null,"principal":{"client_id":"",'
    b'"groups":[],"roles":["agent"],"scopes":[],"subject":"","tenant":""},"retry_number":null,'
    b'"retry_of":null,"subject":"","summary":"","supersedes":null,"tool_name":"","trace_context":null}'
    b'{"action_hash":"","arguments":{},"charges":null,"claims_key":true,"contract_hash":null,'
    b'{"attempt":1,"charges":null,"external_request_id":"ext-","fencing_token":1,"idempotency_key":"",'
    b'"lease_expires_at":"T:00.Z","lease_owner":"writ-gateway","retry_of_attempt":null}'
    b'{"evidence":{},"external_request_id":null,"result":{"content":[{"text":"","type":"text"}],'
    b'"isError":false}}'
)

PACKED_2 = 2
"""The first byte of a text, its embedded JSON written out, deflated against `DICTIONARY_2`."""

# What the gateway writes per call beyond DICTIONARY_1's parts, and the frame of an MCP result whose
# text content is embedded JSON (written out between 0x02 and 0x03), most repeated last.
DICTIONARY_2 = DICTIONARY_1 + (
    b'"lease_owner":"'
    b'"external_request_id":"req_01'
    b'"message":"decided by rule \''
    b'"contract_hash":"sha256:'
    b'"action_hash":"sha256:'
    b'{"content":[{"text":\x02{"'
    b'\x03,"type":"text"}],"isError":false,"structuredContent":{"'
)

_OPEN, _CLOSE = "\x02", "\x03"
# `scanstring` and `encode_basestring` are what `json.loads` and `json.dumps(..., ensure_ascii=False)`
# do to one string, without a new encoder per call: the json module's C functions, which `json.decoder`
# and `json.encoder` hand out under the same names but which only `_json` declares to a type checker.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_WRITTEN_OUT = re.compile("\x02([^\x03]*)\x03")
# Control characters that JSON escapes in six characters (`\u0001`), and the two marker bytes: a string
# holding one is not written out (`\b`, `\t`, `\n`, `\f` and `\r` escape in two and may be).
_WIDE = re.compile("[\x00-\x07\x0b\x0e-\x1f]")

_LEVEL = 6
_WINDOW = 12  # a 4 KiB window holds the dictionary and the texts stored here
_MEMORY = 4  # small hash tables: less to set up and to copy for each short text
# Primed once: a copy of a primed compressor starts where it stands, about a quarter fewer instructions
# than taking in the dictionary again (callgrind). `copy` holds the object's lock: threads may share it.
# Unpacking is not primed: a decompressor takes the dictionary in as a plain copy, cheaper than a copy
# of a whole decompressor.
_PACKER = zlib.compressobj(_LEVEL, zlib.DEFLATED, -_WINDOW, _MEMORY, zlib.Z_DEFAULT_STRATEGY, DICTIONARY_1)
_PACKER_2 = zlib.compressobj(_LEVEL, zlib.DEFLATED, -_WINDOW, _MEMORY, zlib.Z_DEFAULT_STRATEGY, DICTIONARY_2)
_DICTIONARIES = {PACKED_1: DICTIONARY_1, PACKED_2: DICTIONARY_2}


_CACHED = 1024
"""Texts up to this length are remembered (the last 512 of each way): the principal of every call of
one agent, and a call's principal and arguments written again each time its row is updated or read."""

MAX_UNPACKED = 256 * 1024 * 1024
"""The most bytes one stored text unpacks to: far above any result Writ keeps (a backend's
`max_response_bytes` is 4 MiB by default). Deflate expands up to about 1,000 times, so a row forged by
whoever can write the database could otherwise make every reader of the log allocate without end;
beyond this it reads as an unreadable text, which verify names as a corrupt event."""

_REMEMBERED_UNPACKED = 16 * 1024
"""A remembered text unpacks to at most this: 512 of them stay small whatever the rows hold."""


def pack(text: str) -> bytes:
    """`text` in its stored form: deflated against `DICTIONARY_2` with its embedded JSON written out
    when that is shorter, else its UTF-8."""
    return _pack_short(text) if len(text) <= _CACHED else _pack(text)


def unpack(stored: bytes | str) -> str:
    """The text `pack` was given; text stored as it is (SQLite, rows from before packing) comes back as it is.

    Bytes that are not a whole packed text or not UTF-8 (a damaged or hand-edited row) come back as
    text that is not JSON, which every reader of the log already refuses as a corrupt event.
    """
    if isinstance(stored, str):
        return stored
    data = bytes(stored)
    if len(data) <= _CACHED and (text := _unpack_short(data)) is not None:
        return text
    return _unpack(data, MAX_UNPACKED) or _unreadable(data)


def _pack(text: str) -> bytes:
    raw = text.encode("utf-8")
    if _OPEN in text or _CLOSE in text:  # not JSON: those bytes would read as written-out strings
        marker, packer, body = PACKED_1, _PACKER.copy(), raw
    else:
        marker, packer, body = PACKED_2, _PACKER_2.copy(), _written_out(text, raw)
    packed = bytes((marker,)) + packer.compress(body) + packer.flush()
    # UTF-8 beginning with a marker byte (only a text that is not JSON) is always stored packed.
    return packed if len(packed) < len(raw) or raw[:1] in _MARKERS else raw


_MARKERS = (bytes((PACKED_1,)), bytes((PACKED_2,)))


def _written_out(text: str, raw: bytes) -> bytes:
    """`text`'s UTF-8 with each string holding an escaped quote written out between 0x02 and 0x03,
    where escaping it again gives back that very string (`_escaped_again` undoes it).

    Found from each escaped quote (the string it is in starts at the quote before it), not by reading
    every string: a payload holds dozens, and the rare one with an escaped quote is what matters."""
    at = text.find('\\"')
    if at < 0:
        return raw
    parts: list[str] = []
    last = 0
    while at >= 0:
        start = text.rfind('"', last, at)
        found = _STRING.match(text, start) if start >= 0 else None
        if found is None or found.end() <= at:
            at = text.find('\\"', at + 2)
            continue
        token = found.group()
        try:
            inner, end = scanstring(token, 1)
        except ValueError:  # not a JSON string (the text is not JSON): left as it is
            end = 0
        if end == len(token) and not _WIDE.search(inner) and encode_basestring(inner) == token:
            parts += (text[last : found.start()], _OPEN, inner, _CLOSE)
            last = found.end()
        at = text.find('\\"', found.end())
    if not parts:
        return raw
    parts.append(text[last:])
    try:
        return "".join(parts).encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate escaped in the string: keep it escaped
        return raw


def _escaped_again(text: str, limit: int) -> str | None:
    """The text `_written_out` was given; None if it could be longer than `limit` (as `_unpack`).

    A string written out holds no character that escapes to more than two (`_WIDE`), so the text
    grows at most by the strings' own length: checked before each is escaped, so that a forged row
    cannot make a reader allocate more than twice the bound.
    """
    if _OPEN not in text:
        return text
    parts: list[str] = []
    size, last = len(text), 0
    for found in _WRITTEN_OUT.finditer(text):
        inner = found.group(1)
        size += len(inner)
        if size > limit:
            return None
        if _WIDE.search(inner):  # never written out so: a damaged or forged row
            return _unreadable(text.encode("utf-8"))
        parts += (text[last : found.start()], encode_basestring(inner))
        last = found.end()
    parts.append(text[last:])
    return "".join(parts)


def _unpack(stored: bytes, limit: int) -> str | None:
    """The text, or None when it unpacks to more than `limit` bytes."""
    data = stored
    try:
        dictionary = _DICTIONARIES.get(data[0]) if data else None
        if dictionary is not None:
            unpacker = zlib.decompressobj(-15, zdict=dictionary)
            data = unpacker.decompress(data[1:], limit)
            if unpacker.unconsumed_tail:
                return None
            data += unpacker.flush()
            if not unpacker.eof or unpacker.unused_data or len(data) > limit:
                return _unreadable(stored)
            if stored[0] == PACKED_2:
                return _escaped_again(data.decode("utf-8"), limit)
        return data.decode("utf-8")
    except (zlib.error, UnicodeDecodeError):
        return _unreadable(stored)


_pack_short = lru_cache(maxsize=512)(_pack)
_unpack_short = lru_cache(maxsize=512)(functools.partial(_unpack, limit=_REMEMBERED_UNPACKED))


def _unreadable(stored: bytes) -> str:
    return "\ufffdunreadable stored text: " + bytes(stored[:16]).hex()
