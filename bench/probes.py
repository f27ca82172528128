"""What a gateway's store costs per call, read before and after a measured window: fsyncs and bytes.

- fsyncs: `writ serve` runs under `strace -f --seccomp-bpf -e trace=fsync,fdatasync -ttt`, which stops
  the process only on those two calls (the seccomp filter lets every other system call through), and
  the calls are counted by their timestamps inside the window. On SQLite these are the store's
  fsyncs. On PostgreSQL the server makes them: its WAL syncs (`pg_stat_wal.wal_sync`, PostgreSQL 14+)
  are counted over the window, for the whole cluster, so anything else writing to the same server
  inflates them (the benchmark prints them as an upper bound).
- bytes: SQLite's pages in use (`page_count - freelist_count`, WAL included, as any reader sees them),
  PostgreSQL's `pg_total_relation_size` of every table in the store's schema (heap, indexes, TOAST).
- policy checks: the calls the budget `agent-calls-per-hour` counted and the loop marks written (the
  demo's loop rules and the benchmark's budgets, when `--policy-checks on`): evidence that the checks
  ran on every call of a row measured with them, and on none of a row measured without.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import sqlalchemy as sa

STRACE = shutil.which("strace")


def strace_prefix(out: Path) -> list[str]:
    """The command prefix that records every fsync of a process tree into `out`, or [] without strace."""
    if STRACE is None:
        return []
    only = ["-e", "trace=fsync,fdatasync", "-e", "signal=none"]
    return [STRACE, "-f", "--seccomp-bpf", "-qq", *only, "-ttt", "-o", str(out)]


def traced_child(pid: int, timeout_s: float = 30.0) -> int:
    """The process strace (`pid`) started: the one whose CPU the benchmark measures."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            if children:
                return int(children[0])
        time.sleep(0.05)
    raise RuntimeError(f"strace {pid} started no process")


def stop_traced(pid: int, timeout_s: float = 10.0) -> None:
    """Stop (SIGTERM, then SIGKILL) every process strace `pid` started, and wait until they are gone."""
    with contextlib.suppress(OSError):
        children = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        for child in children:
            _stop_pid(child, timeout_s)


def _stop_pid(pid: int, timeout_s: float) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not Path(f"/proc/{pid}").exists() or _zombie(pid):
                return
            time.sleep(0.05)


def _zombie(pid: int) -> bool:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    return True


def fsyncs_between(trace: Path, start: float, end: float) -> int:
    """fsync and fdatasync calls in an `strace -ttt` log with timestamps in [start, end]."""
    count = 0
    with contextlib.suppress(FileNotFoundError), trace.open() as lines:
        for line in lines:
            parts = line.split(maxsplit=2)
            if len(parts) < 3 or not parts[2].startswith(("fsync(", "fdatasync(")):
                continue
            with contextlib.suppress(ValueError):
                if start <= float(parts[1]) <= end:
                    count += 1
    return count


@dataclass
class StoreProbe:
    """Reads a store's size and (for strace'd gateways) its fsyncs at the window's edges."""

    url: str
    trace: Path | None = None
    _start: float = 0.0
    _bytes: int = 0
    _wal_syncs: int = 0
    _checks: tuple[int, int] | None = None

    def start(self) -> None:
        self._bytes, self._wal_syncs = store_bytes(self.url), _wal_syncs(self.url)
        self._checks = policy_counts(self.url)
        self._start = time.time()

    def stop(self) -> dict[str, int | None]:
        end = time.time()
        grown = store_bytes(self.url) - self._bytes
        wal = _wal_syncs(self.url)
        checks, before = policy_counts(self.url), self._checks
        return {
            "budget_calls": None if checks is None or before is None else checks[0] - before[0],
            "loop_marks": None if checks is None or before is None else checks[1] - before[1],
            "store_bytes": grown,
            "gateway_fsyncs": None if self.trace is None else _settled(self.trace, self._start, end),
            "server_wal_syncs": None if self.url.startswith("sqlite") else wal - self._wal_syncs,
        }


def _settled(trace: Path, start: float, end: float) -> int:
    time.sleep(0.2)  # strace writes each line as the call returns; let the last ones reach the file
    return fsyncs_between(trace, start, end)


def store_bytes(url: str) -> int:
    """Bytes the store's tables and indexes take now."""
    if url.startswith("sqlite"):
        path = url.removeprefix("sqlite:///")
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            (pages,) = db.execute("PRAGMA page_count").fetchone()
            (free,) = db.execute("PRAGMA freelist_count").fetchone()
            (size,) = db.execute("PRAGMA page_size").fetchone()
            return int((pages - free) * size)
    with _postgres(url) as conn:
        found = conn.execute(
            sa.text(
                "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = :schema AND c.relkind IN ('r', 'p', 'm')"
            ),
            {"schema": _schema(url)},
        ).scalar_one()
        return int(found)


BUDGET_COUNTING_CALLS = "agent-calls-per-hour"
"""The budget of `processes.POLICY_CHECK_BUDGETS` that counts every call of the benchmark's agent."""


def policy_counts(url: str) -> tuple[int, int] | None:
    """The calls counted so far against `BUDGET_COUNTING_CALLS` (every window) and the loop marks
    written, or None for a store from before budgets and loop rules."""
    budget = "SELECT coalesce(sum(used_micros), 0) FROM budget_counters WHERE budget_id = :budget"
    marks = "SELECT count(*) FROM loop_marks"
    if url.startswith("sqlite"):
        path = url.removeprefix("sqlite:///")
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            try:
                (used,) = db.execute(budget.replace(":budget", "?"), (BUDGET_COUNTING_CALLS,)).fetchone()
                (count,) = db.execute(marks).fetchone()
            except sqlite3.OperationalError:  # no such table
                return None
            return int(used) // 1_000_000, int(count)
    schema = _schema(url).replace('"', '""')  # the connection's search_path is the server's default
    budget = budget.replace("FROM budget_counters", f'FROM "{schema}".budget_counters')
    marks = marks.replace("FROM loop_marks", f'FROM "{schema}".loop_marks')
    with _postgres(url) as conn:
        try:
            used = conn.execute(sa.text(budget), {"budget": BUDGET_COUNTING_CALLS}).scalar_one()
            count = conn.execute(sa.text(marks)).scalar_one()
        except sa.exc.ProgrammingError:  # no such table
            return None
        return int(used) // 1_000_000, int(count)


def _wal_syncs(url: str) -> int:
    if url.startswith("sqlite"):
        return 0
    with _postgres(url) as conn:
        return int(conn.execute(sa.text("SELECT wal_sync FROM pg_stat_wal")).scalar_one())


def _schema(url: str) -> str:
    options = parse_qs(urlsplit(url).query).get("options", [""])[0]
    return options.removeprefix("-csearch_path=") or "public"


@contextlib.contextmanager
def _postgres(url: str) -> Iterator[sa.Connection]:
    base = url.split("?", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    engine = sa.create_engine(base, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            yield conn
    finally:
        engine.dispose()
