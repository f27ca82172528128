"""The store suite runs every test against SQLite (a temp file) and PostgreSQL (a throwaway schema)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import psycopg
import pytest

from store import Store


@pytest.fixture
def pg_schema_url(postgres_url: str) -> Iterator[str]:
    """A URL whose search_path is a fresh schema, dropped afterwards; fails if PostgreSQL is down."""
    schema = f"writ_t_{secrets.token_hex(6)}"
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
    separator = "&" if "?" in postgres_url else "?"
    try:
        yield f"{postgres_url}{separator}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture(params=["sqlite", "postgres"])
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
