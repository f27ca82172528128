"""Fixtures of the fault suite: a PostgreSQL schema shared by replicas, and the acme-payments backend."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from store import Store
from tests.e2e.harness import Backend, acme_backend


@pytest.fixture
def pg_url(postgres_url: str) -> Iterator[str]:
    schema = f"writ_rep_{uuid.uuid4().hex[:10]}"
    engine = sa.create_engine(postgres_url.replace("postgresql://", "postgresql+psycopg://", 1))
    with engine.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    url = f"{postgres_url}?options=-csearch_path%3D{schema}"
    with Store.open(url) as store:
        store.migrate()  # once, before the replicas start
    try:
        yield url
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        engine.dispose()


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[Backend]:
    with acme_backend(tmp_path) as b:
        yield b
