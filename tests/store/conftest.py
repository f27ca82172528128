"""The store suite runs every test against SQLite (a temp file) and PostgreSQL (a throwaway schema).

Migrating takes about a second a test on PostgreSQL, most of the suite's time: `store` starts from a
database migrated once per session and emptied back to what the migrations left in it (a copy of the
SQLite file; the PostgreSQL schema truncated and its seed rows put back). A test that changes the
schema itself (a downgrade) takes `own_store`, migrated for it alone.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from store import Store
from tests.postgres import Snapshot, fresh_schema


@pytest.fixture
def pg_schema_url(postgres_url: str) -> Iterator[str]:
    """A URL whose search_path is a fresh schema, dropped afterwards; fails if PostgreSQL is down."""
    with fresh_schema(postgres_url) as url:
        yield url


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A database of the parametrized kind, not migrated."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path_factory.mktemp('store')}/writ.db"
    return request.getfixturevalue("pg_schema_url")


@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated once, copied for each test."""
    path = tmp_path_factory.mktemp("migrated") / "writ.db"
    with Store.open(f"sqlite:///{path}") as store:
        store.migrate()
    return path


@pytest.fixture(scope="session")
def migrated_postgres(postgres_url: str) -> Iterator[Snapshot]:
    """A PostgreSQL schema migrated once, truncated back to its seed rows for each test."""
    with fresh_schema(postgres_url, "writ_suite") as url:
        with Store.open(url) as store:
            store.migrate()
        yield Snapshot.take(url)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def migrated_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database of the parametrized kind, migrated and holding only what the migrations put there."""
    if request.param == "sqlite":
        path = tmp_path / "writ.db"
        source, target = sqlite3.connect(request.getfixturevalue("migrated_sqlite")), sqlite3.connect(path)
        try:
            source.backup(target)
        finally:
            source.close()
            target.close()
        return f"sqlite:///{path}"
    snapshot: Snapshot = request.getfixturevalue("migrated_postgres")
    snapshot.restore()
    return snapshot.url


@pytest.fixture
def store(migrated_url: str) -> Iterator[Store]:
    with Store.open(migrated_url) as opened:
        yield opened


@pytest.fixture
def own_store(store_url: str) -> Iterator[Store]:
    """A database migrated for this test alone, for a test that changes the schema."""
    with Store.open(store_url) as opened:
        opened.migrate()
        yield opened
