"""Sealed segments of the log moved out of the database into files, and read back for verify and rebuild.

A segment is a run of events from the first one still in the database up to a seq that a signed
checkpoint vouches for, all older than a given moment, with every call they name settled (terminal).
It is written as gzip JSON lines, one stored row per line (the payload exactly as it was hashed), and
named in the directory's `manifest.jsonl` with its seq range, the `prev_hash` of its first event, the
hash of its last, its event count and the sha256 of the file. Only then are its events deleted from
the database, in one transaction. Nothing of an event changes, so the chain over archive and database
together verifies as it did over the database alone; a file that is missing or edited breaks it, and
the manifest says which file that was.

Only a log of one partition is archived (`Store.archive` refuses a partitioned one): its chain is
the global seq order. `partition` names it in the manifest so that a log of several chains can keep
one manifest per partition when archiving learns to walk them.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, delete, func, select

from store import events as ev
from store.log import read_pages
from store.model import TERMINAL_STATUSES, StoreError
from store.schema import events, tool_calls

MANIFEST = "manifest.jsonl"
SEGMENT_EVENTS = 100_000
"""At most this many events a segment: archiving holds the head lock while it writes the file."""


class ArchiveError(StoreError):
    """An archive directory that cannot be read as the log's beginning (a file missing, edited or foreign)."""

    def __init__(self, message: str, first_bad_seq: int, problem: str = "edited") -> None:
        super().__init__(message)
        self.first_bad_seq = first_bad_seq
        self.problem = problem
        """As verify names it: `deleted` (a file missing) or `edited` (a file not the one named)."""


@dataclass(frozen=True, slots=True)
class Segment:
    """One archived file, as the manifest names it."""

    file: str
    first_seq: int
    last_seq: int
    prev_hash: str
    """The `prev_hash` of its first event: the hash of the segment before it (genesis for seq 1)."""
    last_hash: str
    count: int
    sha256: str
    partition: str | None = None


class ArchivedRow:
    """An archived event, read like a row of the events table (attributes and `_mapping`)."""

    __slots__ = ("_mapping",)

    def __init__(self, mapping: Mapping[str, Any]) -> None:
        # Archived from a log of one partition, whose place in its chain is the global seq.
        self._mapping = {"partition": "", "pseq": mapping["seq"], **mapping}

    def __getattr__(self, name: str) -> Any:
        try:
            return self._mapping[name]
        except KeyError:
            raise AttributeError(name) from None


def segments(directory: Path, partition: str | None = None) -> list[Segment]:
    """The segments the manifest in `directory` names, in seq order ([] when there is none).

    Raises:
        ArchiveError: the manifest is unreadable, or its segments do not follow each other.
    """
    path = directory / MANIFEST
    if not path.exists():
        return []
    found: list[Segment] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            segment = Segment(**json.loads(line))
        except (ValueError, TypeError) as exc:
            raise ArchiveError(f"{path} line {number} is not a segment: {exc}", 1) from None
        if segment.partition == partition:
            found.append(segment)
    expected = 1
    for segment in found:
        if segment.first_seq != expected or segment.last_seq < segment.first_seq:
            raise ArchiveError(
                f"{path}: segment {segment.file} covers seqs {segment.first_seq}-{segment.last_seq}, "
                f"the one before ends at {expected - 1}",
                expected,
                "deleted",
            )
        expected = segment.last_seq + 1
    return found


def archived_seq(directory: Path | None, partition: str | None = None) -> int:
    """The last seq the archive in `directory` holds (0: none)."""
    if directory is None:
        return 0
    found = segments(directory, partition)
    return found[-1].last_seq if found else 0


def read_archive(directory: Path, partition: str | None = None) -> Iterator[ArchivedRow]:
    """Every archived event in seq order, each file checked against the manifest before it is read.

    The events themselves are not checked here: the chain walk that reads them does that.

    Raises:
        ArchiveError: a file is missing, or is not the file the manifest names (its sha256 differs).
    """
    for segment in segments(directory, partition):
        path = directory / segment.file
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ArchiveError(
                f"archive file {path} (seqs {segment.first_seq}-{segment.last_seq}) cannot be read: "
                f"{exc.strerror or exc}",
                segment.first_seq,
                "deleted",
            ) from None
        if hashlib.sha256(data).hexdigest() != segment.sha256:
            raise ArchiveError(
                f"archive file {path} (seqs {segment.first_seq}-{segment.last_seq}) is not the file the "
                "manifest names: it was edited or replaced",
                segment.first_seq,
            )
        try:
            lines = gzip.decompress(data).decode("utf-8").splitlines()
            rows = [ArchivedRow(json.loads(line)) for line in lines if line]
        except (OSError, ValueError) as exc:
            raise ArchiveError(f"archive file {path} cannot be read: {exc}", segment.first_seq) from None
        yield from rows


def archive(
    conn: Connection,
    directory: Path,
    *,
    upto_seq: int,
    before: datetime,
    limit: int = SEGMENT_EVENTS,
    partition: str | None = None,
) -> Segment | None:
    """Move the oldest sealed events, up to `upto_seq` and older than `before`, to a file in `directory`.

    Only events whose calls are all terminal go: the segment ends before the first event of a call
    still open. The file and the manifest line are written and synced before the events are deleted,
    in the caller's transaction; a run that died between the two finds its file on the next run and
    deletes what it holds then. Returns the segment written, or None when nothing may go yet.

    Raises:
        ArchiveError: the archive in `directory` is not this log's beginning.
    """
    directory.mkdir(parents=True, exist_ok=True)
    done = archived_seq(directory, partition)
    first = conn.execute(select(func.min(events.c.seq))).scalar()
    if done:
        if first is not None and first <= done:
            # A previous run wrote its file and died before deleting: the file holds these events.
            conn.execute(delete(events).where(events.c.seq <= done))
        first = done + 1
    elif first is None:
        return None
    elif first != 1:
        raise ArchiveError(f"the log starts at seq {first} and {directory} holds no archive of it", 1)
    last = min(upto_seq, first + limit - 1, _last_before(conn, first, upto_seq, before))
    if last < first:
        return None
    rows = list(read_pages(conn, events.c.seq <= last, after_seq=first - 1))
    if not rows or rows[0].seq != first:
        return None
    name = f"{partition or 'log'}-{first:012d}-{last:012d}.jsonl.gz"
    lines = "".join(
        json.dumps(_stored(row), ensure_ascii=False, separators=(",", ":")) + "\n" for row in rows
    )
    data = gzip.compress(lines.encode("utf-8"), mtime=0)
    _write_synced(directory / name, data)
    segment = Segment(
        file=name,
        first_seq=first,
        last_seq=rows[-1].seq,
        prev_hash=rows[0].prev_hash,
        last_hash=rows[-1].hash,
        count=len(rows),
        sha256=hashlib.sha256(data).hexdigest(),
        partition=partition,
    )
    with (directory / MANIFEST).open("a", encoding="utf-8") as manifest:
        manifest.write(json.dumps(asdict(segment), separators=(",", ":")) + "\n")
        manifest.flush()
        os.fsync(manifest.fileno())
    conn.execute(delete(events).where(events.c.seq >= first, events.c.seq <= segment.last_seq))
    return segment


def _last_before(conn: Connection, first: int, upto_seq: int, before: datetime) -> int:
    """The last seq from `first` that may go: older than `before`, and before any open call's event."""
    stops = [upto_seq]
    young = conn.execute(
        select(func.min(events.c.seq)).where(
            events.c.seq >= first, events.c.seq <= upto_seq, events.c.occurred_at >= ev.format_ts(before)
        )
    ).scalar()
    if young is not None:
        stops.append(young - 1)
    open_call = conn.execute(
        select(func.min(events.c.seq))
        .select_from(events.join(tool_calls, tool_calls.c.tool_call_id == events.c.tool_call_id))
        .where(
            events.c.seq >= first,
            events.c.seq <= upto_seq,
            tool_calls.c.status.not_in(sorted(TERMINAL_STATUSES)),
        )
    ).scalar()
    if open_call is not None:
        stops.append(open_call - 1)
    return min(stops)


def _stored(row: Any) -> dict[str, Any]:
    # The row as stored: the payload stays the text that was hashed, so a re-hash reads the same bytes.
    mapping = row._mapping
    return {name: mapping[name] for name in ev.ENVELOPE_FIELDS}


def _write_synced(path: Path, data: bytes) -> None:
    partial = path.with_name(path.name + ".partial")
    with partial.open("wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    partial.replace(path)
    handle = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)
