"""Pages: a checkpoint too big for one JWS line, signed as several lines that are read as one.

joserfc refuses a compact JWS whose payload is over 128,000 bytes of base64, and a checkpoint signs
every partition's head: a log of some hundreds of partitions does not fit one line. Such a checkpoint
is split by partition into pages, each a line of its own signed alone (version 2), each carrying the
log's identity, the time and the writer as a checkpoint of one line does, plus `set` (an id its pages
share: a digest of everything they sign together) and `page` [k, n]. Page 1 also carries partition ""
(the top-level fields of version 1); every other partition's head is on exactly one page.

A checkpoint is only used whole: one with a page missing does not verify (`incomplete`), since the
partitions of that page would otherwise be anchored by an older checkpoint alone, or by none, with
nothing said. A checkpoint that fits one line is written as before pages (version 1), so that logs of
a few partitions, and Writs that predate pages, read it as they did.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from store.canonical import canonical_json

PAGE_BYTES = 64_000
"""The canonical JSON payload of one line at most: a line of about 86 KB, under joserfc's 128,000
bytes of base64 payload with room to spare: about 735 partitions' heads without digests, 490 with 4."""
ONE_LINE = 1
PAGED = 2
"""The version of a page: a Writ that reads only version 1 refuses it rather than take it for a
whole checkpoint."""
_SHARED = ("log", "at", "writer")
"""What every page repeats of page 1, so that each line names the log and the moment alone."""


@dataclass(frozen=True, slots=True)
class Page:
    """Where a line sits in a checkpoint of several."""

    set: str
    number: int
    of: int


def paginate(payload: dict[str, Any], limit: int | None = None) -> list[dict[str, Any]]:
    """`payload`, a version 1 checkpoint (other partitions under `heads`), as the payloads of its lines:
    itself if its canonical JSON fits in `limit` bytes (default `PAGE_BYTES`), else its pages in order.

    A head too big for a page of its own still gets one (the signer's cover bound keeps it from
    happening: 5,000 digests are about 54 KB).
    """
    limit = PAGE_BYTES if limit is None else limit
    whole = canonical_json(payload).encode("utf-8")
    if len(whole) <= limit:
        return [payload]
    heads: dict[str, Any] = payload.get("heads", {})
    first = {name: value for name, value in payload.items() if name != "heads"}
    shared = {name: payload[name] for name in _SHARED}
    set_id = hashlib.sha256(whole).hexdigest()[:32]
    widest = {"v": PAGED, "set": set_id, "page": [len(heads) + 1, len(heads) + 1], "heads": {}}
    rooms = (limit - _size(first | widest), limit - _size(shared | widest))
    groups: list[list[str]] = [[]]
    room = rooms[0]
    for name in sorted(heads):
        cost = _size({name: heads[name]}) - 1  # the braces, less the comma between entries
        if cost > room and groups[-1]:
            groups.append([])
            room = rooms[1]
        groups[-1].append(name)
        room -= cost
    return [
        (first if number == 1 else shared)
        | {
            "v": PAGED,
            "set": set_id,
            "page": [number, len(groups)],
            "heads": {name: heads[name] for name in names},
        }
        for number, names in enumerate(groups, start=1)
    ]


def page_of(payload: dict[str, Any]) -> Page | None:
    """Where the line of `payload` sits: None for a checkpoint of one line.

    Raises:
        ValueError: the version is not one this Writ reads, or a page says nothing sound of its place.
    """
    version = payload["v"]
    if version == ONE_LINE:
        if "page" in payload or "set" in payload:
            raise ValueError("a checkpoint of one line (version 1) has no page")
        return None
    if version != PAGED:
        raise ValueError(f"version {version!r}, this Writ reads {ONE_LINE} and {PAGED}")
    set_id, place = payload["set"], payload["page"]
    if not (
        isinstance(set_id, str)
        and set_id
        and isinstance(place, list)
        and len(place) == 2
        and all(isinstance(n, int) and not isinstance(n, bool) for n in place)
        and 1 <= place[0] <= place[1]
        and place[1] >= 2
    ):
        raise ValueError("a page must carry its set and page [k, n], 1 <= k <= n, n >= 2")
    if place[0] > 1 and any(name in payload for name in ("seq", "hash", "from_seq", "digests")):
        raise ValueError('partition "" is signed on page 1 only')
    if place[0] > 1 and not payload.get("heads"):
        raise ValueError("a page after the first carries some partition's head")
    return Page(set_id, place[0], place[1])


def missing(pages: Sequence[Page]) -> list[int]:
    """The page numbers of a set that `pages` (of that set) lack.

    Raises:
        ValueError: the pages disagree on how many the set has, or one is there twice.
    """
    counts = {page.of for page in pages}
    if len(counts) != 1:
        raise ValueError(f"its pages disagree on their number: {sorted(counts)}")
    numbers = [page.number for page in pages]
    if len(set(numbers)) != len(numbers):
        raise ValueError("two different lines claim the same page")
    return sorted(set(range(1, counts.pop() + 1)) - set(numbers))


def _size(value: dict[str, Any]) -> int:
    return len(canonical_json(value).encode("utf-8"))
