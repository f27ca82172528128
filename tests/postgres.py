"""A PostgreSQL schema of its own for a test, so tests and replicas never see each other's rows."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator

import psycopg


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
