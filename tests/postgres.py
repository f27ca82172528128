"""A PostgreSQL schema of its own for a test, so tests and replicas never see each other's rows."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from store import Store

STORES = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
"""The params of a fixture whose tests run on each store."""


@contextlib.contextmanager
def store_url_of(kind: str, directory: Path, postgres_url: str, prefix: str) -> Iterator[str]:
    """The URL of an empty store of `kind`: "sqlite", a file in `directory`; "postgres", a schema of
    its own named after `prefix`, dropped afterwards (`fresh_schema`)."""
    if kind == "sqlite":
        yield f"sqlite:///{directory / 'writ.db'}"
        return
    with fresh_schema(postgres_url, prefix) as url:
        yield url


def module_store_url(prefix: str) -> Any:
    """A module-scoped `store_url` fixture whose tests run on each store (`STORES`): assign it to
    `store_url` in the module (`store_url = module_store_url("writ_oauth")`)."""

    @pytest.fixture(scope="module", params=STORES)
    def store_url(
        request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, postgres_url: str
    ) -> Iterator[str]:
        with store_url_of(request.param, tmp_path_factory.mktemp("store"), postgres_url, prefix) as url:
            yield url

    return store_url


@contextlib.contextmanager
def fresh_store(request: Any, directory: Path, **options: Any) -> Iterator[tuple[str, Store]]:
    """A migrated store of the kind a fixture's param names ("sqlite": a file in `directory`; "postgres":
    a schema of its own), its URL, and the open `Store` (`options` go to `Store.open`)."""
    with contextlib.ExitStack() as stack:
        if request.param == "sqlite":
            url = f"sqlite:///{directory / 'writ.db'}"
        else:
            url = stack.enter_context(fresh_schema(request.getfixturevalue("postgres_url")))
        store = stack.enter_context(Store.open(url, **options))
        store.migrate()
        yield url, store


@contextlib.contextmanager
def fresh_schema(postgres_url: str, prefix: str = "writ_t") -> Iterator[str]:
    """A URL whose search_path is a new PostgreSQL schema of its own, dropped afterwards.

    Raises:
        psycopg.OperationalError: PostgreSQL is down (the suite fails then; it never skips).
    """
    schema = f"{prefix}_{secrets.token_hex(6)}"
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
    separator = "&" if "?" in postgres_url else "?"
    try:
        yield f"{postgres_url}{separator}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')


@dataclass(frozen=True)
class Snapshot:
    """A migrated schema's tables and the rows its migrations left in them (the log head, the revision).

    `restore` empties the schema back to them: what a fresh migrated schema holds, in a few
    milliseconds instead of a migration's second.
    """

    url: str
    tables: tuple[str, ...]
    seeds: dict[str, tuple[tuple[str, ...], list[tuple[Any, ...]]]]
    sequences: tuple[str, ...] = ()

    @classmethod
    def take(cls, url: str) -> Snapshot:
        """The schema at `url` as its migrations left it.

        Raises:
            AssertionError: the schema has foreign keys, which `restore` does not handle.
        """
        with psycopg.connect(url, autocommit=True) as conn:
            kept = conn.execute(
                "SELECT count(*) FROM information_schema.table_constraints"
                " WHERE constraint_schema = current_schema() AND constraint_type = 'FOREIGN KEY'"
            ).fetchall()
            assert kept == [(0,)], "foreign keys: restore must order the tables"
            found = conn.execute(
                "SELECT sequence_name FROM information_schema.sequences"
                " WHERE sequence_schema = current_schema()"
            )
            sequences = tuple(sorted(name for (name,) in found))
            names = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
            tables = tuple(sorted(name for (name,) in names))
            seeds = {}
            for table in tables:
                cursor = conn.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier(table)))
                rows = cursor.fetchall()
                if rows:
                    seeds[table] = (tuple(c.name for c in cursor.description or ()), rows)
        return cls(url, tables, seeds, sequences)

    def restore(self) -> None:
        with psycopg.connect(self.url) as conn:  # one transaction: all emptied and seeded, or none
            # DELETE, not TRUNCATE: a few rows each, and TRUNCATE's new files take half a second. The
            # schema has no foreign keys (`take` would have to order the tables).
            for table in self.tables:
                conn.execute(sql.SQL("DELETE FROM {}").format(sql.Identifier(table)))
            for sequence in self.sequences:  # as new: the migrations take no value from any
                conn.execute(sql.SQL("ALTER SEQUENCE {} RESTART").format(sql.Identifier(sequence)))
            for table, (columns, rows) in self.seeds.items():
                insert = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
                    sql.Identifier(table),
                    sql.SQL(", ").join(map(sql.Identifier, columns)),
                    sql.SQL(", ").join(sql.Placeholder() * len(columns)),
                )
                conn.cursor().executemany(insert, rows)
