"""Verifying the log: the hash chain, the anchors, the event grammar and the projections.

The chain names the first event that was edited, deleted, inserted or reordered. It alone cannot
catch someone who rewrites an event and re-seals everything after it (the hash is unkeyed and the
head lives in the same database): checkpoints signed outside the database (`Anchor`s, checked by the
gateway) can, as each vouches for the hashes of a range of seqs in every partition. The same walk
feeds each event to the grammar (store.grammar) and to a replay into scratch projections
(store.replay), which are compared with the live ones at the end, in the same snapshot: what the
runtime acts on must be what the log says.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace
from itertools import chain
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy import Connection, Row, func, select
from sqlalchemy.exc import SQLAlchemyError

from store import events as ev
from store.archive import ArchiveError, Manifest, archived_partitions, archived_seq, log_rows, read_archive
from store.grammar import Grammar
from store.log import envelope_of, partition_rows
from store.model import (
    Anchor,
    AuditReport,
    CorruptEvent,
    GrammarViolation,
    PartitionClaim,
    ScratchUnavailable,
    StoreError,
)
from store.partitions import UNPARTITIONED
from store.replay import Replay
from store.schema import events, log_head

Finding = tuple[str, int, str]
"""(problem, first bad seq, detail)."""


def verify(conn: Connection, anchors: Iterable[Anchor] = (), archive: Path | None = None) -> AuditReport:
    """Walk every partition's chain, streaming, and report the first inconsistency.

    `archive` holds the events moved out to files (store.archive): the walk of each partition reads its
    archived events first, then the database's after them, as one chain. An archive file that cannot be
    read as the manifest names it is a `deleted` (missing) or `edited` finding at its first seq.

    Each anchor must match every partition it vouches for: the same first event (partition ""), the
    hashes it vouches for, and a chain at least as long as the seq it was made at. Once every chain is
    intact, the report also carries the first grammar violation and the first projection row that
    differs from a replay of the log in seq order, if any.
    """
    anchors = tuple(anchors)
    with Replay() as replay:
        follower = _Follower(replay)
        try:
            index = None if archive is None else Manifest(archive).refresh()  # read once
            partitions = _partitions(conn, anchors, index)
        except ArchiveError as exc:
            return _archive_finding(exc)
        single = partitions == [UNPARTITIONED]
        report, anchored, anchored_seq = AuditReport(True, 0), 0, 0
        claims: dict[str, list[tuple[PartitionClaim, Anchor]]] = {}
        for anchor in anchors:  # once: each partition's walk reads its own claims only
            for claim in anchor.claims():
                claims.setdefault(claim.partition, []).append((claim, anchor))
        for partition in partitions:
            vouched = _Vouched(claims.get(partition, []), partition)
            found = _verify_chain(conn, partition, vouched, follower if single else None, index)
            report = replace(
                found,
                events_checked=report.events_checked + found.events_checked,
                anchors_checked=len(anchors),
            )
            if not report.chain_ok:
                return report  # the log itself is altered: a replay of it would prove nothing
            anchored += vouched.newest
            if partition == UNPARTITIONED:
                anchored_seq = vouched.newest
        report = replace(
            report,
            anchored_seq=anchored_seq,
            anchored_events=anchored,
            unanchored_events=report.events_checked - anchored,
        )
        if not single:  # each chain holds: replay the log in its global order
            try:
                for row in log_rows(conn, index, partitions):
                    follower.take(row.seq, envelope_of(row))
            except ArchiveError as exc:  # read once already: changed while verify ran
                return _archive_finding(exc)
        return follower.finish(conn, report)


def _partitions(conn: Connection, anchors: tuple[Anchor, ...], archive: Manifest | None) -> list[str]:
    """Every partition a head row, an event, an anchor or the archive names, in order ("" first,
    even when all are gone)."""
    named = set(conn.execute(select(log_head.c.partition)).scalars())
    named.update(conn.execute(select(events.c.partition).distinct()).scalars())
    named.update(claim.partition for anchor in anchors for claim in anchor.claims())
    named.update(archived_partitions(archive))
    named.add(UNPARTITIONED)
    return sorted(named)


def _archive_finding(exc: ArchiveError) -> AuditReport:
    seq, partition = exc.first_bad_seq, exc.partition
    where = f"partition {partition!r}: " if partition else ""
    return AuditReport(
        False, 0, first_bad_seq=seq, problem=exc.problem, detail=where + str(exc), partition=partition
    )


class _Follower:
    """Feeds each event whose chain link holds to the grammar and to the replay."""

    def __init__(self, replay: Replay) -> None:
        self.replay = replay
        self.grammar = Grammar()
        self.violation: GrammarViolation | None = None
        self.applying = True

    def take(self, seq: int, envelope: dict[str, Any]) -> None:
        if not self.applying and self.violation is not None:
            return
        try:
            event = ev.parse_event(envelope)
        except ValidationError as exc:
            detail = f"event {seq} is not a valid {envelope.get('type')} event: {exc.error_count()} errors"
            self._stop(GrammarViolation(seq, "unreadable_event", detail, envelope.get("tool_call_id")))
            return
        if self.violation is None:
            self.violation = self.grammar.check(event)
        if not self.applying:
            return
        try:
            self.replay.apply(event)
        except ScratchUnavailable:
            raise  # verify could not finish: no finding about the log either way
        except (StoreError, SQLAlchemyError) as exc:
            detail = f"the projector cannot apply it: {str(exc).splitlines()[0]}"
            self._stop(GrammarViolation(seq, "unreplayable", detail, event.tool_call_id))

    def _stop(self, violation: GrammarViolation) -> None:
        self.applying = False
        if self.violation is None:
            self.violation = violation

    def finish(self, conn: Connection, report: AuditReport) -> AuditReport:
        report = replace(report, replayed=True, grammar_violation=self.violation)
        if not self.applying:
            return report
        differences = self.replay.compare(conn)
        return replace(
            report,
            projections_compared=True,
            projection_difference=differences[0] if differences else None,
            differing_tables=tuple(d.table for d in differences),
        )


def _verify_chain(
    conn: Connection, partition: str, vouched: _Vouched, follower: _Follower | None, archive: Manifest | None
) -> AuditReport:
    try:
        done = archived_seq(archive, partition)
        archived: Iterator[Any] = read_archive(archive, partition) if archive is not None else iter(())
        return _walk_chain(conn, partition, vouched, follower, archived, done)
    except ArchiveError as exc:
        return _archive_finding(exc)


def _walk_chain(
    conn: Connection,
    partition: str,
    vouched: _Vouched,
    follower: _Follower | None,
    archived: Iterator[Any],
    after: int,
) -> AuditReport:
    def bad(problem: str, seq: int, detail: str, checked: int) -> AuditReport:
        where = f"partition {partition!r}: " if partition else ""
        return AuditReport(
            False, checked, first_bad_seq=seq, problem=problem, detail=where + detail, partition=partition
        )

    row = conn.execute(
        select(log_head.c.last_seq, log_head.c.last_hash).where(log_head.c.partition == partition)
    ).one_or_none()
    head: tuple[int, str] | None = None if row is None else (row.last_seq, row.last_hash)
    # Every reader pages from seq 1 up (seq > 0), so a row at seq 0 or below would never be walked.
    lowest = conn.execute(select(func.min(events.c.pseq)).where(events.c.partition == partition)).scalar()
    if head is None and lowest is None and not after and vouched.claims:
        head = (0, ev.GENESIS_HASH)  # gone whole, head and all: the anchors say what is missing
    if head is None:
        what = "the log head row" if not partition else "the partition's head row"
        return bad("head_missing", 1, f"{what} is missing: its length and last hash cannot be checked", 0)
    head_seq, head_hash = head
    if isinstance(lowest, int) and lowest < 1:
        return bad(
            "inserted", lowest, f"an event at seq {lowest} lies before the log's first event (seq 1)", 0
        )
    # Events still in the database at or below the archive's end are a run of `writ store archive` that
    # died after writing its file: the file holds them, and the next run deletes them. The chain is
    # walked through the file's; each such row must be the very event the file holds at its seq, or it
    # was put there (or edited) after the archive was written, where nothing else would look at it.
    leftovers = _Leftovers(partition_rows(conn, partition, 0, after) if after else iter(()))
    rows: Iterator[Any] = chain(archived, partition_rows(conn, partition, after))
    expected, prev_hash, checked = 1, ev.GENESIS_HASH, 0
    current = next(rows, None)
    while current is not None:
        following = next(rows, None)
        checked_row = _check(current, following, expected, prev_hash)
        finding = (
            checked_row
            if isinstance(checked_row, tuple)
            else leftovers.check(current) or vouched.check(current.pseq, current.hash)
        )
        if finding is not None:
            problem, seq, detail = finding
            return bad(problem, seq, detail, checked)
        assert isinstance(checked_row, dict)
        if follower is not None:
            follower.take(current.seq, checked_row)
        checked += 1
        expected, prev_hash, current = expected + 1, current.hash, following
    last_seq = expected - 1
    if head_seq > last_seq:
        detail = f"the head records {head_seq} events, the log ends at seq {last_seq}"
        return bad("truncated", last_seq + 1, detail, checked)
    if head_seq < last_seq:
        return bad("inserted", head_seq + 1, f"the log continues past the head's seq {head_seq}", checked)
    if head_hash != prev_hash:
        detail = "the last event's hash differs from the one the head recorded when it was appended"
        return bad("edited", last_seq, detail, checked)
    cut = vouched.beyond(last_seq)
    if cut is not None:
        return bad("truncated", last_seq + 1, cut, checked)
    return AuditReport(True, checked)


class _Leftovers:
    """The database's rows at archived seqs, each checked against the archived event at its seq as the
    walk passes it."""

    def __init__(self, rows: Iterator[Any]) -> None:
        self._rows = rows
        self._next = next(rows, None)

    def check(self, archived: Any) -> Finding | None:
        """The finding about the database's rows up to `archived`'s seq, which must be that event."""
        while self._next is not None and self._next.pseq <= archived.pseq:
            row, self._next = self._next, next(self._rows, None)
            if row.pseq < archived.pseq or not _same_event(row, archived):
                detail = (
                    f"event {row.pseq} in the database is not the event the archive holds at that seq: "
                    "it was edited or put there after the archive was written"
                )
                return ("edited", row.pseq, detail)
        return None


def _same_event(row: Any, archived: Any) -> bool:
    try:
        stored = envelope_of(row)
    except CorruptEvent:
        return False
    same_links = (row.hash, row.prev_hash) == (archived.hash, archived.prev_hash)
    return same_links and stored == envelope_of(archived)


class _Vouched:
    """What the anchors say each seq's hash in one partition is, checked as the walk reaches it."""

    def __init__(self, claims: list[tuple[PartitionClaim, Anchor]], partition: str) -> None:
        """`claims`: what each anchor vouches for in `partition`."""
        self.partition = partition
        self.claims = claims
        self.log_ids = [(anchor.log_id, anchor) for claim, anchor in self.claims] if not partition else []
        self._digests: dict[int, list[tuple[str, Anchor]]] = {}
        self._heads: dict[int, list[tuple[str, PartitionClaim, Anchor]]] = {}
        for claim, anchor in self.claims:
            for offset, digest in enumerate(claim.digests, start=claim.from_seq + 1):
                self._digests.setdefault(offset, []).append((digest, anchor))
            self._heads.setdefault(claim.seq, []).append((claim.hash, claim, anchor))

    @property
    def newest(self) -> int:
        """The newest seq an anchor vouches for in the partition (0: none)."""
        return max((claim.seq for claim, _ in self.claims), default=0)

    def check(self, seq: int, hash_: str) -> Finding | None:
        what = "the partition" if self.partition else "the log"
        if seq == 1:
            for log_id, anchor in self.log_ids:
                if log_id != hash_:
                    detail = (
                        f"the checkpoint at {anchor.source} was made for a log whose first event hashes "
                        f"otherwise: another log's checkpoint, or this log was rewritten from seq 1"
                    )
                    return ("foreign_checkpoint", 1, detail)
        for digest, anchor in self._digests.get(seq, ()):
            if not hash_.startswith(digest):
                detail = (
                    f"event {seq}'s hash is not the one the checkpoint at {anchor.source} vouches for: "
                    "it was rewritten and the chain re-sealed after it"
                )
                return ("rewritten", seq, detail)
        for vouched_hash, claim, anchor in self._heads.get(seq, ()):
            if vouched_hash != hash_:
                # Outside the digests' cover: the rewrite is somewhere at or before the first seq covered.
                first = min(claim.from_seq + 1, seq)
                detail = (
                    f"{what} up to seq {seq} is not the one the checkpoint at {anchor.source} vouches for: "
                    f"an event at or before seq {first} was rewritten"
                )
                return ("rewritten", first, detail)
        return None

    def beyond(self, last_seq: int) -> str | None:
        """Why a chain ending at `last_seq` was cut off, if an anchor vouches for more of it."""
        beyond = [(claim, anchor) for claim, anchor in self.claims if claim.seq > last_seq]
        if not beyond:
            return None
        claim, anchor = max(beyond, key=lambda found: found[0].seq)
        what, head = ("the partition", "its head") if self.partition else ("the log", "the head")
        return (
            f"the checkpoint at {anchor.source} vouches for {claim.seq} events, "
            f"{what} ends at seq {last_seq}: events were cut off and {head} moved back"
        )


def _check(
    row: Row[Any], following: Row[Any] | None, expected: int, prev_hash: str
) -> Finding | dict[str, Any]:
    """The finding about `row`, or its envelope when it hashes and links as it should."""
    place = row.pseq  # the seq in its partition: the global seq itself with one partition
    if place != expected:
        if place == expected + 1 and following is not None and following.pseq == expected:
            # Rows of an archive file are read in the file's order, not sorted: two were swapped there.
            return ("reordered", expected, f"events {expected} and {place} are out of order")
        return ("deleted", expected, f"seq {expected} is missing; the next event has seq {place}")
    try:
        envelope = envelope_of(row)
    except CorruptEvent:
        return ("edited", place, f"event {place}'s payload is not JSON")
    try:
        computed = ev.compute_hash(envelope)
    except ValueError:  # NaN, a lone surrogate: nothing Writ appends, so it was put there afterwards
        return ("edited", place, f"event {place}'s content is not JSON that can be hashed")
    if computed != row.hash:
        return _explain_mismatch(row, following, envelope)
    if row.prev_hash != prev_hash:
        if following is not None and following.prev_hash == prev_hash and row.prev_hash == following.hash:
            # Two events, each intact, traded places in the chain (their seqs in the partition).
            return ("reordered", place, f"events {place} and {place + 1} were swapped")
        # Both events hash correctly on their own, so one was rewritten with a recomputed hash;
        # the earlier one is the first that can no longer be trusted.
        bad = max(place - 1, 1)
        detail = f"event {place} does not link to event {place - 1}: one of them was rewritten"
        return ("broken_chain", bad, detail)
    return envelope


def _explain_mismatch(row: Row[Any], following: Row[Any] | None, envelope: dict[str, Any]) -> Finding:
    # An event hashes with the seq it was appended at, so a valid hash at a neighbouring seq
    # tells how the event moved rather than merely that it changed (one partition: seq is pseq).
    seq = row.seq
    if seq != row.pseq:  # several partitions: the neighbours' global seqs are not seq +- 1
        place = row.pseq
        if (
            following is not None
            and ev.compute_hash({**envelope, "seq": following.seq}) == row.hash
            and row.prev_hash == following.hash
        ):
            return ("reordered", place, f"events {place} and {place + 1} were swapped")
        return ("edited", place, f"event {place}'s content does not match its hash")
    if ev.compute_hash({**envelope, "seq": seq - 1}) == row.hash:
        return (
            "inserted",
            seq - 1,
            f"event {seq} was appended at seq {seq - 1}: an event was inserted before it",
        )
    if ev.compute_hash({**envelope, "seq": seq + 1}) == row.hash:
        if following is not None and row.prev_hash == following.hash:
            return ("reordered", seq, f"events {seq} and {seq + 1} were swapped")
        return ("deleted", seq, f"event {seq} was appended at seq {seq + 1}: an event before it was removed")
    return ("edited", seq, f"event {seq}'s content does not match its hash")
