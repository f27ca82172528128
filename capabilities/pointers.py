"""JSON pointers (RFC 6901): where a lookup's records, and a record's state, are in a JSON value."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

ABSENT: Any = object()
"""What a pointer finds where the value has nothing (distinct from a JSON null)."""

_INDEX = re.compile(r"0|[1-9][0-9]*")


def parse_pointer(pointer: str) -> tuple[str, ...]:
    """The reference tokens of `pointer`, unescaped (`~1` is `/`, `~0` is `~`); `""` is the whole value.

    Raises:
        ValueError: `pointer` is not a JSON pointer, saying why.
    """
    if pointer == "":
        return ()
    if not pointer.startswith("/"):
        raise ValueError(
            f"{pointer!r} is not a JSON pointer (RFC 6901): it must start with '/', e.g. /refunds"
        )
    tokens = pointer[1:].split("/")
    for token in tokens:
        if re.search(r"~(?![01])", token):
            raise ValueError(
                f"{pointer!r} is not a JSON pointer (RFC 6901): '~' must be followed by 0 or 1 "
                "('~0' is '~', '~1' is '/')"
            )
    return tuple(token.replace("~1", "/").replace("~0", "~") for token in tokens)


def escape_token(name: str) -> str:
    """`name` as one reference token of a pointer (`a/b` is `a~1b`)."""
    return name.replace("~", "~0").replace("/", "~1")


def resolve(value: Any, pointer: str) -> Any:
    """What `pointer` names in the JSON `value`, or `ABSENT`.

    Raises:
        ValueError: `pointer` is not a JSON pointer (config validation refuses those first).
    """
    for token in parse_pointer(pointer):
        if isinstance(value, Mapping):
            value = value.get(token, ABSENT)
        elif isinstance(value, list) and _INDEX.fullmatch(token) and int(token) < len(value):
            value = value[int(token)]
        else:
            return ABSENT
        if value is ABSENT:
            return ABSENT
    return value
