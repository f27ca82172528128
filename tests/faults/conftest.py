"""Fixtures of the fault suite: a PostgreSQL schema shared by replicas, and the acme-payments backend."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from store import Store
from tests.e2e.harness import Backend, acme_backend
from tests.postgres import fresh_schema


@pytest.fixture
def pg_url(postgres_url: str) -> Iterator[str]:
    with fresh_schema(postgres_url, "writ_rep") as url:
        with Store.open(url) as store:
            store.migrate()  # once, before the replicas start
        yield url


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[Backend]:
    with acme_backend(tmp_path) as b:
        yield b
