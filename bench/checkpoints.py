"""Checkpoints and archiving of a log with many partitions (issue 16, items 7 and 8).

    python bench/checkpoints.py [--partitions 10,100,1000] [--stores sqlite,postgres] [--checkpoints 1,20]
                                [--no-archive]

No gateway: each row is a fresh store partitioned by tenant, with one settled call (an admission and an
outcome, 4 events) in each of N tenants, built through `Store`. Printed per row: the lines a
checkpoint of every partition takes and their sizes; the time to make one (`write_checkpoint`: read
the heads and hashes, sign, append and fsync, read back), to sign alone, and to read the directory back
(`read_all`: every signature checked, pages assembled); `store.verify` without checkpoints and with
the K checkpoints written (K from `--checkpoints`, written back to back); then `Store.archive_all` of
every partition, a second call with nothing left to move, and `verify --archive`. Times are wall
clock, medians of `--rounds` where cheap enough; the load average is printed, since the machine is shared.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))

from gateway.audit.checkpoints import (  # noqa: E402
    CheckpointSigner,
    Cover,
    read_all,
    trusted_keys,
    write_checkpoint,
)
from store import Store  # noqa: E402
from store.partitions import Partitioning  # noqa: E402
from tests.postgres import fresh_schema  # noqa: E402
from tests.store.builders import NOW, call_request, outcome  # noqa: E402

POSTGRES_URL = os.environ.get("WRIT_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
AT = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


@contextmanager
def opened(kind: str, directory: Path) -> Iterator[Store]:
    if kind == "sqlite":
        with Store.open(f"sqlite:///{directory / 'writ.db'}", partitioning=Partitioning("tenant")) as store:
            store.migrate()
            yield store
        return
    with (
        fresh_schema(POSTGRES_URL, prefix="writ_bench") as url,
        Store.open(url, partitioning=Partitioning("tenant")) as store,
    ):
        store.migrate()
        yield store


def timed(work: Callable[[], Any], rounds: int = 1) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(rounds):
        started = time.perf_counter()
        result = work()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def row(kind: str, partitions: int, counts: list[int], rounds: int, archive: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp, opened(kind, Path(tmp)) as store:
        directory = Path(tmp)
        started = time.perf_counter()
        for n in range(partitions):
            name = f"c{n}"
            store.admit(
                call_request(tool_call_id=name, idempotency_key=name, tenant=f"t{n:05d}", run_id=f"r{n}")
            )
            store.record_outcome(outcome(name, "completed", result={"n": n}, now=NOW))
        built = time.perf_counter() - started
        signer = CheckpointSigner.load_or_create(directory / "key.jwk", directory / "trusted.jwks")
        keys = trusted_keys(directory / "trusted.jwks")
        cp = directory / "cp"
        made_s, (made, path) = timed(lambda: write_checkpoint(store, signer, cp, keys, AT, previous={}))
        heads = store.partition_heads()
        covers = {
            name: Cover(seq, hash_, 0, store.event_hashes(0, seq, name))
            for name, (seq, hash_) in heads.items()
            if name
        }
        sign_s, lines = timed(
            lambda: signer.sign(
                log_id="0" * 64, seq=0, hash_="", from_seq=0, hashes=[], now=AT, heads=covers
            ),
            rounds,
        )
        sizes = [len(line) for line in made.lines]
        print(
            f"{kind:8} {partitions:5} partitions (built in {built:.1f} s): {len(sizes)} line(s), "
            f"{max(sizes):,} bytes the longest, {sum(sizes):,} in all; "
            f"write_checkpoint {made_s * 1000:.0f} ms, "
            f"sign {sign_s * 1000:.1f} ms ({len(lines)} lines)",
            flush=True,
        )
        for count in counts:
            for k in range(count - len(read_all([cp], keys))):  # the rest of K, one second apart
                write_checkpoint(store, signer, cp, keys, AT + timedelta(seconds=k + 1), previous={})
            read_s, found = timed(lambda: read_all([cp], keys), rounds)
            anchors = [c.anchor for c in found]
            plain_s, plain = timed(store.verify, rounds)
            anchored_s, report = timed(lambda: store.verify(anchors), rounds)  # noqa: B023
            assert plain.ok and report.ok, report
            print(
                f"{'':8} {len(found):3} checkpoint(s): read_all {read_s * 1000:.0f} ms; verify "
                f"{plain_s * 1000:.0f} ms without them, {anchored_s * 1000:.0f} ms with them "
                f"({report.events_checked} events)",
                flush=True,
            )
        if not archive:
            return
        upto = {name: seq for name, (seq, _) in heads.items()}
        before = NOW + timedelta(days=1)
        moved_s, moved = timed(
            lambda: list(store.archive_all(directory / "archive", upto_seq=upto, before=before))
        )
        again_s, again = timed(lambda: store.archive(directory / "archive", upto_seq=upto, before=before))
        anchors = [c.anchor for c in read_all([cp], keys)]
        checked_s, checked = timed(lambda: store.verify(anchors, directory / "archive"))
        assert again is None and checked.ok, checked
        print(
            f"{'':8} archive_all {moved_s:.2f} s ({len(moved)} segments), a call with nothing to move "
            f"{again_s * 1000:.1f} ms, verify --archive {checked_s:.2f} s",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--partitions", default="10,100,1000")
    parser.add_argument("--stores", default="sqlite,postgres")
    parser.add_argument(
        "--checkpoints", default="1,20", help="verify with this many checkpoints of every head"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-archive", action="store_true")
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()}", flush=True)
    for kind in args.stores.split(","):
        for partitions in (int(n) for n in args.partitions.split(",")):
            counts = [int(n) for n in args.checkpoints.split(",")]
            row(kind, partitions, counts, args.rounds, not args.no_archive)
    print(f"load average at end: {os.getloadavg()}", flush=True)


if __name__ == "__main__":
    main()
