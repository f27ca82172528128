"""Cutting a stdio MCP server's stdout into JSON-RPC messages, none held past a size limit.

Over stdio a message is one line: the MCP spec has messages delimited by newlines and forbids
newlines inside them (JSON escapes them in strings). So the next newline always ends the message,
and a message over the limit can be skipped to it without losing the ones after it: the server, its
state and the other calls in flight stay as they are, as over HTTP, where each answer has a frame of
its own. The skip is bounded too (`SKIP_FACTOR` times the limit): a line that goes on past that is a
flood, and reading it to its end would cost more than starting the server again, so the reader gives
up the stream.

A message over the limit is never parsed. Where its first and last bytes show it answers a request
(it has `result` or `error`, no `method`, and an `id` near either end, where the Python and the
TypeScript SDKs write it), that request gets a JSON-RPC error saying so; otherwise it is dropped,
like a line that is not JSON-RPC.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass

import mcp_types
from mcp.shared.message import SessionMessage

from capabilities.bounded_http import LIMIT_SETTING

logger = logging.getLogger(__name__)

SKIP_FACTOR = 16
"""A message over the limit is read on (and dropped) to its end for at most this many limits."""
HEAD_BYTES = 4096
TAIL_BYTES = 1024

_KEY = rb'"([^"\\]{1,64})"'
_SCALAR = rb'-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|"[^"\\]{0,256}"|null|true|false'
_OPEN = re.compile(rb"\s*\{")
_HEAD_MEMBER = re.compile(rb"\s*" + _KEY + rb"\s*:\s*(?:(" + _SCALAR + rb")\s*(,)?)?")
_TAIL_MEMBERS = re.compile(rb"((?:,\s*" + _KEY + rb"\s*:\s*(?:" + _SCALAR + rb")\s*)+)\}\s*$")
_TAIL_MEMBER = re.compile(_KEY + rb"\s*:\s*(" + _SCALAR + rb")")


def too_large_message(limit: int) -> str:
    """The message of the error (PARSE_ERROR) a request gets for an answer over the limit."""
    return f"Message over {limit} bytes ({LIMIT_SETTING}), skipped unread"


class MessageTooLarge(ValueError):
    """A message over the limit that answers no request it could be matched to (dropped)."""


@dataclass
class _Skipping:
    """The message over the limit being read past."""

    head: bytes
    tail: bytes
    size: int


class MessageReader:
    """Turns chunks of a server's stdout into what the SDK's read stream carries: messages, and
    exceptions for lines that are not one. Holds at most `limit` bytes of a line.

    A message over the limit is answered (or dropped) once its line has ended, or once it has gone
    on for `SKIP_FACTOR` limits: then `gave_up` is set and the rest of the stream is not for reading.
    """

    def __init__(self, limit: int, encoding: str = "utf-8", errors: str = "strict") -> None:
        self.limit = limit
        self.gave_up = False
        self._encoding = encoding
        self._errors = errors
        self._line = bytearray()
        self._skipping: _Skipping | None = None

    def feed(self, chunk: bytes) -> list[SessionMessage | Exception]:
        """What the lines `chunk` ends make, in order (nothing once `gave_up`)."""
        items: list[SessionMessage | Exception] = []
        start = 0
        while not self.gave_up:
            end = chunk.find(b"\n", start)
            self._take(chunk[start:] if end < 0 else chunk[start:end], items)
            if end < 0 or self.gave_up:
                break
            self._finish(items)
            start = end + 1
        return items

    def _take(self, piece: bytes, items: list[SessionMessage | Exception]) -> None:
        skipping = self._skipping
        if skipping is None and len(self._line) + len(piece) <= self.limit:
            self._line += piece
            return
        if skipping is None:
            line = self._line
            head = bytes(line[:HEAD_BYTES]) + piece[: max(0, HEAD_BYTES - len(line))]
            skipping = self._skipping = _Skipping(head, bytes(line[-TAIL_BYTES:]), len(line))
            self._line = bytearray()  # a new buffer: clear() may keep the old one's memory
        skipping.size += len(piece)
        skipping.tail = (skipping.tail + piece)[-TAIL_BYTES:]
        if skipping.size > SKIP_FACTOR * self.limit:
            logger.warning(
                "a message from the server went on past %d bytes: the stream is given up", skipping.size
            )
            self.gave_up = True
            self._skipping = None
            self._answer(skipping.head, b"", skipping.size, items)

    def _finish(self, items: list[SessionMessage | Exception]) -> None:
        skipping, self._skipping = self._skipping, None
        if skipping is not None:
            self._answer(skipping.head, skipping.tail, skipping.size, items)
            return
        line, self._line = bytes(self._line), bytearray()
        items.append(self._parse(line))

    def _answer(self, head: bytes, tail: bytes, size: int, items: list[SessionMessage | Exception]) -> None:
        """Tell the request a message over the limit answers, if it shows which one."""
        message = too_large_message(self.limit)
        request_id = answered_request(head, tail)
        if request_id is None:
            logger.warning("dropped a message of %d bytes or more that answers no request it names", size)
            items.append(MessageTooLarge(message))
            return
        error = mcp_types.ErrorData(code=mcp_types.PARSE_ERROR, message=message)
        items.append(SessionMessage(mcp_types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error)))

    def _parse(self, line: bytes) -> SessionMessage | Exception:
        try:
            text = line.decode(self._encoding, self._errors)
            message = mcp_types.jsonrpc_message_adapter.validate_json(text, by_name=False)
        except ValueError as exc:  # also UnicodeDecodeError: one bad line, not a dead transport
            logger.warning("a line from the server is not a JSON-RPC message: %s", str(exc)[:200])
            return exc
        return SessionMessage(message)


def answered_request(head: bytes, tail: bytes = b"") -> mcp_types.RequestId | None:
    """The id of the request a message starting with `head` (and ending with `tail`) answers, when
    these show it is an answer: members with short plain values at the start of the top-level
    object, and the first member that has another value; members with such values at its end."""
    members = _head_members(head)
    match = _TAIL_MEMBERS.search(tail)
    if match is not None:
        members.update((_text(m[1]), m[2]) for m in _TAIL_MEMBER.finditer(match[1]))
    raw = members.get("id")
    if raw is None or "method" in members or not {"result", "error"} & members.keys():
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    if isinstance(value, bool) or not isinstance(value, int | str):
        return None
    return value


def _head_members(head: bytes) -> dict[str, bytes | None]:
    """Key -> raw value (None for a value not shown) of the members `head` starts with."""
    members: dict[str, bytes | None] = {}
    opened = _OPEN.match(head)
    if opened is None:
        return members
    position = opened.end()
    while (member := _HEAD_MEMBER.match(head, position)) is not None:
        members[_text(member[1])] = member[2]
        if member[2] is None or member[3] is None:
            break
        position = member.end()
    return members


def _text(key: bytes) -> str:
    return key.decode("utf-8", "replace")
