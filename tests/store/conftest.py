"""The store suite runs every test against SQLite (a temp file) and PostgreSQL (a throwaway schema)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from store import Store
from tests.postgres import fresh_schema


@pytest.fixture
def pg_schema_url(postgres_url: str) -> Iterator[str]:
    """A URL whose search_path is a fresh schema, dropped afterwards; fails if PostgreSQL is down."""
    with fresh_schema(postgres_url) as url:
        yield url


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path_factory.mktemp('store')}/writ.db"
    return request.getfixturevalue("pg_schema_url")


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    opened = Store.open(store_url)
    opened.migrate()
    try:
        yield opened
    finally:
        opened.close()
