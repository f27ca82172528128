"""Sealed segments of the log moved out of the database into files, and read back for verify and rebuild.

A segment is a run of one partition's events (store.partitions) from the first one still in the
database up to a seq that a signed checkpoint vouches for in that partition, all older than a given
moment, with every call they name settled (terminal). It is written as gzip JSON lines, one stored row
per line (the payload exactly as it was hashed, with the row's partition and its seq there), and named
in the directory's `manifest.jsonl` with its partition, its seq range in the partition, the `prev_hash`
of its first event, the hash of its last, its event count and the sha256 of the file. Only then are its
events deleted from the database, in one transaction. Nothing of an event changes, so each chain over
archive and database together verifies as it did over the database alone; a file that is missing or
edited breaks it, and the manifest says which file that was.

Partition "" is named `null` in the manifest, as every archive written before partitions named its
one chain (whose seqs are the log's global seqs), so those archives read as partition "" still.
"""

from __future__ import annotations

import gzip
import hashlib
import heapq
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from datetime import datetime
from itertools import chain
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import Connection, delete, func, select

from store import events as ev
from store.log import partition_rows
from store.model import TERMINAL_STATUSES, StoreError
from store.partitions import UNPARTITIONED
from store.schema import events, read_correlation, stored_correlation, tool_calls

MANIFEST = "manifest.jsonl"
SEGMENT_EVENTS = 100_000
"""At most this many events a segment: archiving holds the partition's head lock while it writes the file."""


class ArchiveError(StoreError):
    """An archive directory that cannot be read as the log's beginning (a file missing, edited or foreign)."""

    def __init__(
        self, message: str, first_bad_seq: int, problem: str = "edited", partition: str = ""
    ) -> None:
        super().__init__(message)
        self.first_bad_seq = first_bad_seq
        """The seq in `partition`."""
        self.problem = problem
        """As verify names it: `deleted` (a file missing) or `edited` (a file not the one named)."""
        self.partition = partition


@dataclass(frozen=True, slots=True)
class Segment:
    """One archived file, as the manifest names it."""

    file: str
    first_seq: int
    """Its first event's seq in its partition (`pseq`; in partition "" of a log that was never
    partitioned, the global seq too)."""
    last_seq: int
    prev_hash: str
    """The `prev_hash` of its first event: the hash of the segment before it (genesis for seq 1)."""
    last_hash: str
    count: int
    sha256: str
    partition: str | None = None
    """None for partition "" (as before partitions)."""

    @property
    def chain(self) -> str:
        """The partition it is a segment of."""
        return self.partition or UNPARTITIONED


class ArchivedRow:
    """An archived event, read like a row of the events table (attributes and `_mapping`)."""

    __slots__ = ("_mapping",)

    def __init__(self, mapping: Mapping[str, Any]) -> None:
        # A row archived before partitions names neither: it is of partition "", where pseq is seq.
        self._mapping = {"partition": UNPARTITIONED, "pseq": mapping["seq"], **mapping}
        # The file holds the correlation id itself; the table, its stored form (`stored_correlation`).
        self._mapping["correlation_id"] = stored_correlation(
            mapping["correlation_id"], mapping["tool_call_id"]
        )

    def __getattr__(self, name: str) -> Any:
        try:
            return self._mapping[name]
        except KeyError:
            raise AttributeError(name) from None


def _segment(path: Path, number: int, line: str) -> Segment:
    try:
        return Segment(**json.loads(line))
    except (ValueError, TypeError) as exc:
        raise ArchiveError(f"{path} line {number} is not a segment this Writ reads: {exc}", 1) from None


def _gap(directory: Path, segment: Segment, expected: int) -> ArchiveError:
    return ArchiveError(
        f"{directory / MANIFEST}: segment {segment.file} covers seqs {segment.first_seq}-"
        f"{segment.last_seq}, the one before ends at {expected - 1}",
        expected,
        "deleted",
        segment.chain,
    )


class Manifest:
    """The manifest of an archive directory, its segments by partition: read whole at the first
    `refresh`, then only the lines appended since. The manifest is append-only and every archiver
    appends holding partition ""'s head, so an archiving run over many partitions does not parse it
    again for each one, and verify and rebuild, which read every partition's segments, read it once.
    Each partition's segments are checked to follow each other as they are read."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._read = 0
        """Bytes of the file read so far: complete lines only."""
        self._lines = 0
        self._chains: dict[str, list[Segment]] = {}

    def refresh(self) -> Manifest:
        """Read what was appended since the last refresh; the manifest itself.

        Raises:
            ArchiveError: a new line is unreadable, or a partition's segments do not follow each other.
        """
        path = self.directory / MANIFEST
        try:
            with path.open("rb") as fh:
                if os.fstat(fh.fileno()).st_size < self._read:  # not appended to: read it all again
                    self._read, self._lines, self._chains = 0, 0, {}
                fh.seek(self._read)
                tail = fh.read()
        except FileNotFoundError:
            self._read, self._lines, self._chains = 0, 0, {}
            return self
        complete = tail[: tail.rfind(b"\n") + 1]
        for line in complete.decode("utf-8").splitlines():
            self._lines += 1
            if not line.strip():
                continue
            segment = _segment(path, self._lines, line)
            expected = self.archived_seq(segment.chain) + 1
            if segment.first_seq != expected or segment.last_seq < segment.first_seq:
                raise _gap(self.directory, segment, expected)
            self._chains.setdefault(segment.chain, []).append(segment)
        self._read += len(complete)
        return self

    def archived_seq(self, partition: str | None = UNPARTITIONED) -> int:
        """The last seq of `partition` archived, as of the last refresh (0: none)."""
        found = self._chains.get(partition or UNPARTITIONED)
        return found[-1].last_seq if found else 0

    def partitions(self) -> set[str]:
        return set(self._chains)

    def segments(self, partition: str | None = UNPARTITIONED) -> list[Segment]:
        """The segments of `partition`, in seq order, as of the last refresh ([] when none)."""
        return list(self._chains.get(partition or UNPARTITIONED, ()))


ArchiveDir = Path | Manifest
"""An archive directory, or its manifest already read."""


def _archived(directory: ArchiveDir) -> Manifest:
    return directory if isinstance(directory, Manifest) else Manifest(directory).refresh()


def archived_partitions(directory: ArchiveDir | None) -> set[str]:
    """The partitions the archive in `directory` holds segments of.

    Raises:
        ArchiveError: the manifest is unreadable.
    """
    return set() if directory is None else _archived(directory).partitions()


def segments(directory: ArchiveDir, partition: str | None = UNPARTITIONED) -> list[Segment]:
    """The segments of `partition` the manifest in `directory` names, in seq order ([] when none).

    Raises:
        ArchiveError: the manifest is unreadable, or the partition's segments do not follow each other.
    """
    return _archived(directory).segments(partition)


def archived_seq(directory: ArchiveDir | None, partition: str | None = UNPARTITIONED) -> int:
    """The last seq of `partition` the archive in `directory` holds (0: none)."""
    return 0 if directory is None else _archived(directory).archived_seq(partition)


def read_archive(directory: ArchiveDir, partition: str | None = UNPARTITIONED) -> Iterator[ArchivedRow]:
    """Every archived event of `partition` in its seq order, each file checked against the manifest
    before it is read.

    The events themselves are not checked here: the chain walk that reads them does that.

    Raises:
        ArchiveError: a file is missing, or is not the file the manifest names (its sha256 differs).
    """
    chain_name = partition or UNPARTITIONED
    index = _archived(directory)
    for segment in index.segments(chain_name):
        path = index.directory / segment.file
        where = f"archive file {path} (seqs {segment.first_seq}-{segment.last_seq})"
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ArchiveError(
                f"{where} cannot be read: {exc.strerror or exc}", segment.first_seq, "deleted", chain_name
            ) from None
        if hashlib.sha256(data).hexdigest() != segment.sha256:
            raise ArchiveError(
                f"{where} is not the file the manifest names: it was edited or replaced",
                segment.first_seq,
                partition=chain_name,
            )
        try:
            lines = gzip.decompress(data).decode("utf-8").splitlines()
            rows = [ArchivedRow(json.loads(line)) for line in lines if line]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ArchiveError(
                f"archive file {path} cannot be read: {exc}", segment.first_seq, partition=chain_name
            ) from None
        for row in rows:
            if row.partition != chain_name:
                raise ArchiveError(
                    f"{where} holds an event of partition {row.partition!r}",
                    segment.first_seq,
                    partition=chain_name,
                )
        yield from rows


def log_rows(conn: Connection, directory: ArchiveDir | None, partitions: Iterable[str]) -> Iterator[Any]:
    """Every event of `partitions` in the log's global seq order: of each, the events archived in
    `directory` first, then those in the database after them.

    Raises:
        ArchiveError: as `read_archive`.
    """
    streams = []
    index = None if directory is None else _archived(directory)
    for partition in sorted(set(partitions)):
        archived: Iterator[Any] = read_archive(index, partition) if index is not None else iter(())
        done = archived_seq(index, partition)
        streams.append(chain(archived, partition_rows(conn, partition, done)))
    # Each partition's seqs grow along its chain, so merging the chains by seq is the global order.
    return heapq.merge(*streams, key=lambda row: row.seq)


def archive(
    conn: Connection,
    directory: Path,
    *,
    upto_seq: int,
    before: datetime,
    limit: int = SEGMENT_EVENTS,
    partition: str = UNPARTITIONED,
    done: int | None = None,
) -> Segment | None:
    """Move the oldest sealed events of `partition`, up to its seq `upto_seq` and older than `before`,
    to a file in `directory`; the caller holds the partition's head.

    Only events whose calls are all terminal go: the segment ends before the first event of a call
    still open. The file and the manifest line are written and synced before the events are deleted,
    in the caller's transaction; a run that died between the two finds its file on the next run and
    deletes what it holds then. Returns the segment written, or None when nothing may go yet.

    `done`: the last seq of the partition archived in `directory`, when the caller read the manifest
    holding the heads (`Manifest`); else it is read here.

    Raises:
        ArchiveError: the archive in `directory` is not this log's beginning.
    """
    # The files hold every event as stored, arguments and results: readable by their owner only, as
    # the database is.
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    mine = events.c.partition == partition
    if done is None:
        done = archived_seq(directory, partition)
    first = conn.execute(select(func.min(events.c.pseq)).where(mine)).scalar()
    if done:
        if first is not None and first <= done:
            # A previous run wrote its file and died before deleting: the file holds these events.
            conn.execute(delete(events).where(mine, events.c.pseq <= done))
        first = done + 1
    elif first is None:
        return None
    elif first != 1:
        where = f"partition {partition!r} of the log" if partition else "the log"
        raise ArchiveError(
            f"{where} starts at seq {first} and {directory} holds no archive of it", 1, partition=partition
        )
    last = min(upto_seq, first + limit - 1, _last_before(conn, partition, first, upto_seq, before))
    if last < first:
        return None
    rows = list(partition_rows(conn, partition, first - 1, last))
    if not rows or rows[0].pseq != first:
        return None
    name = f"{_file_stem(partition)}-{first:012d}-{last:012d}.jsonl.gz"
    lines = "".join(
        json.dumps(_stored(row), ensure_ascii=False, separators=(",", ":")) + "\n" for row in rows
    )
    data = gzip.compress(lines.encode("utf-8"), mtime=0)
    _write_synced(directory / name, data)
    segment = Segment(
        file=name,
        first_seq=first,
        last_seq=rows[-1].pseq,
        prev_hash=rows[0].prev_hash,
        last_hash=rows[-1].hash,
        count=len(rows),
        sha256=hashlib.sha256(data).hexdigest(),
        partition=partition or None,
    )
    manifest_fd = os.open(directory / MANIFEST, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(manifest_fd, "a", encoding="utf-8") as manifest:
        manifest.write(json.dumps(asdict(segment), separators=(",", ":")) + "\n")
        manifest.flush()
        os.fsync(manifest.fileno())
    conn.execute(delete(events).where(mine, events.c.pseq >= first, events.c.pseq <= segment.last_seq))
    return segment


def _file_stem(partition: str) -> str:
    # A tenant's name may hold any character; quoted, it is one safe file name ("t:a/1" -> "t%3Aa%2F1").
    return "log" if partition == UNPARTITIONED else quote(partition, safe="")


def _last_before(conn: Connection, partition: str, first: int, upto_seq: int, before: datetime) -> int:
    """The last seq of `partition` from `first` that may go: older than `before`, and before any open
    call's event."""
    stops = [upto_seq]
    span = (events.c.partition == partition, events.c.pseq >= first, events.c.pseq <= upto_seq)
    young = conn.execute(
        select(func.min(events.c.pseq)).where(*span, events.c.occurred_at >= ev.format_ts(before))
    ).scalar()
    if young is not None:
        stops.append(young - 1)
    open_call = conn.execute(
        select(func.min(events.c.pseq))
        .select_from(events.join(tool_calls, tool_calls.c.tool_call_id == events.c.tool_call_id))
        .where(*span, tool_calls.c.status.not_in(sorted(TERMINAL_STATUSES)))
    ).scalar()
    if open_call is not None:
        stops.append(open_call - 1)
    return min(stops)


def _stored(row: Any) -> dict[str, Any]:
    # The row as stored: the payload stays the text that was hashed, so a re-hash reads the same bytes.
    mapping = row._mapping
    return {name: mapping[name] for name in ev.ENVELOPE_FIELDS} | {
        "correlation_id": read_correlation(mapping["correlation_id"], mapping["tool_call_id"]),
        "partition": mapping["partition"],
        "pseq": mapping["pseq"],
    }


def _write_synced(path: Path, data: bytes) -> None:
    partial = path.with_name(path.name + ".partial")
    with os.fdopen(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    partial.replace(path)
    handle = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)
