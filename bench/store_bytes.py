"""Where a call's bytes go in the store: per table and index, payload against envelope, on both stores.

    python bench/store_bytes.py [--calls 1000] [--stores sqlite,postgres] [--tree DIR]
    python bench/store_bytes.py --db URL [--db URL ...]

No gateway: the calls are recorded through `Store` as the pipeline records them, the way the
benchmark's MCP scenario makes them (one session run; a read with arguments of its own recorded in
one commit by `record_read`; a write with a unique client key, `admit` then `record_outcome`). Each
kind runs in a fresh store: the store is measured before and after the calls and the growth is
divided by their number. SQLite: `dbstat` (pages of each table and index, the bytes of cells in
them); PostgreSQL: `pg_relation_size` of each table, index and TOAST relation, after a `VACUUM` so
that every row is counted once. Then the events table's content: the payload's text against the rest
of the row (the envelope), summed by the database itself (`length`, `pg_column_size`). `--tree DIR`
imports `store/` from another source tree, to put two commits side by side.

`--db URL` takes a store a real gateway wrote instead (`bench/run.py --workdir DIR` keeps each one:
`DIR/*/writ-sqlite-1/writ.db`, and the PostgreSQL URL in `DIR/*/writ-postgres-1/writ.yaml`): every
relation's size and every column's bytes of `events`, `tool_calls` and `effect_ledger`, divided by
its calls (rows of `tool_calls`), and each payload type as stored against its text. These are totals,
not growth: the first calls' pages and the tables nothing per call writes are in them.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sqlite3
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"

# The lookup_order answer of the benchmark's upstream (acme-payments' order, as MCP text content).
READ_RESULT = {
    "content": [
        {
            "type": "text",
            "text": '{"order_id": "1001", "customer": "Ada Lovelace", "status": "delivered", '
            '"total": "250.00", "currency": "EUR", "items": 2}',
        }
    ],
    "isError": False,
}
WRITE_RESULT = {
    "content": [
        {"type": "text", "text": '{"refund_id": "rf_8c1d2e", "status": "succeeded", "amount": "0.01"}'}
    ],
    "isError": False,
}


def _calls(kind: str, count: int) -> Callable[[Any], None]:
    from store import OutcomeRecord, ReadRecord
    from tests.store.builders import call_request, new_id, outcome

    run = new_id("run")

    def request(n: int) -> Any:
        if kind == "read":
            req = call_request(
                tool_name="lookup_order",
                capability_id="lookup_order",
                effect_class="read",
                dedupe_window_s=0,
                key_source="derived",
                idempotency_key="derived:" + os.urandom(32).hex(),
                action_hash=os.urandom(32).hex(),
                arguments={"order_id": "1001", "request": f"{n}-{new_id('r')}"},
                run_id=run,
                run_origin="session",
            )
            return dataclasses.replace(req, summary="lookup_order(order_id=1001)")
        return call_request(
            tool_name="refund_order",
            capability_id="refund_order",
            idempotency_key=new_id("key"),
            action_hash=os.urandom(32).hex(),
            arguments={
                "order_id": "1001",
                "amount": "0.01",
                "currency": "EUR",
                "reason": f"{n}-{new_id('r')}",
            },
            run_id=run,
            run_origin="session",
        )

    def record(store: Any) -> None:
        for n in range(count):
            req = request(n)
            if kind == "read":
                store.record_read(
                    ReadRecord(
                        req, OutcomeRecord("completed", result=READ_RESULT), observed_at=req.identity.now
                    )
                )
            else:
                admission = store.admit(req)
                done = outcome(
                    req.identity.tool_call_id,
                    "completed",
                    token=admission.call.lease_token,
                    now=req.identity.now,
                )
                store.record_outcome(
                    dataclasses.replace(done, outcome=OutcomeRecord("completed", result=WRITE_RESULT))
                )

    return record


def sqlite_sizes(path: str) -> dict[str, tuple[int, int]]:
    """Per table or index: bytes of its pages, and bytes of the cells in them (payload)."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        rows = db.execute("SELECT name, sum(pgsize), sum(payload) FROM dbstat GROUP BY name").fetchall()
    return {name: (int(pages), int(cells)) for name, pages, cells in rows}


def sqlite_content(path: str) -> dict[str, int]:
    with contextlib.closing(sqlite3.connect(path)) as db:
        cols = [r[1] for r in db.execute("PRAGMA table_info(events)")]
        envelope = " + ".join(f"coalesce(length(CAST({c} AS BLOB)), 0)" for c in cols if c != "payload")
        payload, rest, count = db.execute(
            f"SELECT sum(length(CAST(payload AS BLOB))), sum({envelope}), count(*) FROM events"
        ).fetchone()
        types = db.execute("SELECT type, count(*), sum(length(payload)) FROM events GROUP BY type").fetchall()
    out = {"events.payload": int(payload or 0), "events.envelope": int(rest or 0), "events.count": int(count)}
    out.update({f"payload {t} (x{n})": int(s) for t, n, s in types})
    return out


def postgres_sizes(url: str) -> dict[str, tuple[int, int]]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM")
        rows = conn.execute(
            "SELECT c.relname, c.relkind, pg_relation_size(c.oid), t.relname FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace LEFT JOIN pg_class t ON t.reltoastrelid = c.oid "
            "WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'i')"
        ).fetchall()
        toast = conn.execute(
            "SELECT c.relname, coalesce(pg_total_relation_size(c.reltoastrelid), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = current_schema() AND c.relkind = 'r'"
        ).fetchall()
    sizes = {name: (int(size), 0) for name, _, size, _ in rows}
    sizes.update({f"{name} (TOAST)": (int(size), 0) for name, size in toast if size})
    return sizes


def postgres_content(url: str) -> dict[str, int]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        found = conn.execute(
            "SELECT sum(pg_column_size(payload)), sum(pg_column_size(e.*)), count(*) FROM events e"
        ).fetchone()
        assert found is not None
        payload, whole, count = found
        types = conn.execute(
            "SELECT type, count(*), sum(octet_length(payload)) FROM events GROUP BY type"
        ).fetchall()
    out = {
        "events.payload": int(payload or 0),
        "events.envelope": int(whole - payload),
        "events.count": int(count),
    }
    out.update({f"payload {t} (x{n})": int(s) for t, n, s in types})
    return out


@contextlib.contextmanager
def _store_url(name: str) -> Iterator[tuple[str, str]]:
    if name == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            yield f"sqlite:///{tmp}/writ.db", f"{tmp}/writ.db"
    else:
        from tests.postgres import fresh_schema

        with fresh_schema(POSTGRES_URL, prefix="writ_bytes") as url:
            yield url, url


def measure(name: str, kind: str, calls: int) -> tuple[dict[str, int], dict[str, int], int]:
    """Bytes per call of each relation, of the events' content, and in all."""
    from store import Store

    sizes = sqlite_sizes if name == "sqlite" else postgres_sizes
    content = sqlite_content if name == "sqlite" else postgres_content
    with _store_url(name) as (url, where):
        with Store.open(url) as store:
            store.migrate()
            _calls(kind, 1)(store)  # the session's run and the first pages of every table
            before, content_before = sizes(where), content(where)
            _calls(kind, calls)(store)
        after, content_after = sizes(where), content(where)
    grown = {rel: (after[rel][0] - before.get(rel, (0, 0))[0]) // calls for rel in after}
    cells = {rel: (after[rel][1] - before.get(rel, (0, 0))[1]) // calls for rel in after}
    per_call = {rel: b for rel, b in grown.items() if b or cells[rel]}
    if name == "sqlite":
        per_call = {f"{rel} (cells {cells[rel]})": b for rel, b in per_call.items()}
    body = {k: (content_after[k] - content_before.get(k, 0)) // calls for k in content_after}
    body["events per call x100"] = body.pop("events.count") * 100 if "events.count" in body else 0
    return per_call, body, sum(grown.values())


ACCOUNTED = ("events", "tool_calls", "effect_ledger")


def column_bytes(url: str) -> dict[str, dict[str, int]]:
    """Per table of `ACCOUNTED`, per column: the bytes its values take, as the database counts them."""
    if url.startswith("sqlite"):
        with contextlib.closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as db:
            return {
                table: {
                    col: int(
                        db.execute(
                            f'SELECT coalesce(sum(length(CAST("{col}" AS BLOB))), 0) FROM {table}'
                        ).fetchone()[0]
                    )
                    for (col,) in db.execute(f"SELECT name FROM pragma_table_info('{table}')")
                }
                for table in ACCOUNTED
            }
    import psycopg

    with psycopg.connect(url) as conn:
        out = {}
        for table in ACCOUNTED:
            cols = [
                r[0]
                for r in conn.execute(
                    "SELECT column_name FROM information_schema.columns "
                    "WHERE table_schema = current_schema() "
                    "AND table_name = %s ORDER BY ordinal_position",
                    (table,),
                )
            ]
            sums = conn.execute(
                "SELECT "
                + ", ".join(f'coalesce(sum(pg_column_size("{c}")), 0)' for c in cols)
                + f" FROM {table}"
            ).fetchone()
            assert sums is not None
            out[table] = {c: int(v) for c, v in zip(cols, sums, strict=True)}
        return out


def payload_types(url: str) -> list[tuple[str, int, int, int]]:
    """Per event type: events, bytes of payload as stored, bytes of its text."""
    from store.packing import unpack

    if url.startswith("sqlite"):
        with contextlib.closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as db:
            rows = db.execute("SELECT type, payload FROM events").fetchall()
    else:
        import psycopg

        with psycopg.connect(url) as conn:
            rows = conn.execute("SELECT type, payload FROM events").fetchall()
    found: dict[str, list[int]] = {}
    for kind, payload in rows:
        stored = payload.encode() if isinstance(payload, str) else bytes(payload)
        seen = found.setdefault(kind, [0, 0, 0])
        seen[0] += 1
        seen[1] += len(stored)
        seen[2] += len(unpack(payload).encode())
    return [(kind, n, stored, text) for kind, (n, stored, text) in sorted(found.items())]


def account(url: str) -> None:
    """Print where an existing store's bytes are, per call."""
    if url.startswith("sqlite"):
        with contextlib.closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as db:
            (calls,) = db.execute("SELECT count(*) FROM tool_calls").fetchone()
        sizes = sqlite_sizes(url.removeprefix("sqlite:///"))
    else:
        import psycopg

        with psycopg.connect(url) as conn:
            found = conn.execute("SELECT count(*) FROM tool_calls").fetchone()
            assert found is not None
            (calls,) = found
        sizes = postgres_sizes(url)
    calls = max(int(calls), 1)
    total = sum(pages for pages, _ in sizes.values())
    print(f"\n{url}: {calls} calls, {total / calls:.0f} bytes per call in all relations")
    for rel, (pages, cells) in sorted(sizes.items(), key=lambda item: -item[1][0]):
        if pages:
            shown = f"{rel} (cells {cells / calls:.0f})" if url.startswith("sqlite") else rel
            print(f"  {shown:60} {pages / calls:8.1f}")
    for table, cols in column_bytes(url).items():
        print(f"  {table}: {sum(cols.values()) / calls:.1f} bytes of values per call")
        for col, size in sorted(cols.items(), key=lambda item: -item[1]):
            if size:
                print(f"    {col:58} {size / calls:8.1f}")
    print("  payload per event type: events per call, bytes stored and as text per event")
    for kind, n, stored, text in payload_types(url):
        print(f"    {kind:40} {n / calls:5.2f} {stored / n:8.1f} {text / n:8.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--stores", default="sqlite,postgres")
    parser.add_argument("--kinds", default="read,write")
    parser.add_argument("--tree", type=Path, default=None, help="import store/ from this source tree")
    parser.add_argument(
        "--db", action="append", default=[], help="account for this existing store instead (repeatable)"
    )
    args = parser.parse_args()
    tree = (args.tree or HERE).resolve()
    sys.path.insert(0, str(HERE))  # tests.store.builders, from this tree
    sys.path.insert(0, str(tree))
    if args.db:
        for url in args.db:
            account(url)
        return
    print(f"tree {tree}, {args.calls} calls of each kind")
    for name in args.stores.split(","):
        for kind in args.kinds.split(","):
            per_call, body, total = measure(name, kind, args.calls)
            print(f"\n{name} {kind}: {total} bytes per call")
            for rel, size in sorted(per_call.items(), key=lambda item: -item[1]):
                print(f"  {rel:60} {size:6}")
            print("  events' content per call (bytes, before page overhead):")
            for what, size in body.items():
                print(f"    {what:58} {size:6}")


if __name__ == "__main__":
    main()
