"""Fixtures that start the real backend and the real gateway, on SQLite and on PostgreSQL: as processes,
or in this process (`inproc_*`, tests/gateway/mcp/inproc.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.harness import Backend, Gateway, acme_backend, writ_gateway
from tests.gateway.mcp import inproc
from tests.postgres import fresh_schema


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[Backend]:
    with acme_backend(tmp_path) as b:
        yield b


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path, postgres_url: str) -> Iterator[str]:
    """A fresh store: a SQLite file, or a PostgreSQL schema of its own (dropped afterwards)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'writ.db'}"
        return
    with fresh_schema(postgres_url, "writ_e2e") as url:
        yield url


@pytest.fixture
def gateway(tmp_path: Path, backend: Backend, store_url: str) -> Iterator[Gateway]:
    with writ_gateway(tmp_path, backend, store_url) as g:
        yield g


@pytest.fixture
def sqlite_gateway(tmp_path: Path, backend: Backend) -> Iterator[Gateway]:
    with writ_gateway(tmp_path, backend, f"sqlite:///{tmp_path / 'writ.db'}") as g:
        yield g


# One backend and one gateway per module and store, for modules whose cases only need the standard
# gateway: starting the two processes costs more than most cases. Such cases keep apart by their own
# keys, principals and orders, and count the backend's refunds before and after instead of from zero.


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def module_store_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, postgres_url: str
) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('store') / 'writ.db'}"
        return
    with fresh_schema(postgres_url, "writ_e2e") as url:
        yield url


@pytest.fixture(scope="module")
def module_backend(tmp_path_factory: pytest.TempPathFactory, module_store_url: str) -> Iterator[Backend]:
    """A backend per store too, so a derived key sent by the SQLite gateway is not seen again."""
    with acme_backend(tmp_path_factory.mktemp("acme")) as b:
        yield b


@pytest.fixture(scope="module")
def module_gateway(
    tmp_path_factory: pytest.TempPathFactory, module_backend: Backend, module_store_url: str
) -> Iterator[Gateway]:
    with writ_gateway(tmp_path_factory.mktemp("writ"), module_backend, module_store_url) as g:
        yield g


@pytest.fixture(scope="module")
def module_sqlite_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    with acme_backend(tmp_path_factory.mktemp("acme")) as b:
        yield b


@pytest.fixture(scope="module")
def module_sqlite_gateway(
    tmp_path_factory: pytest.TempPathFactory, module_sqlite_backend: Backend
) -> Iterator[Gateway]:
    """The module's one gateway on SQLite, for cases that are about the edge, not the store."""
    workdir = tmp_path_factory.mktemp("writ")
    with writ_gateway(workdir, module_sqlite_backend, f"sqlite:///{workdir / 'writ.db'}") as g:
        yield g


# The same, served in this process: no `writ serve`, no backend process, the CLI run by its own `main`.
# A module whose cases are about what the gateway does, not about its processes, asks for these; a case
# that needs its own configuration opens its own `inproc.writ(...)`, which costs little.


@pytest.fixture(scope="module")
def inproc_backend(tmp_path_factory: pytest.TempPathFactory, module_store_url: str) -> Iterator[Backend]:
    """A backend per store, as `module_backend`."""
    with inproc.acme(tmp_path_factory.mktemp("acme")) as b:
        yield b


@pytest.fixture(scope="module")
def inproc_gateway(
    tmp_path_factory: pytest.TempPathFactory, inproc_backend: Backend, module_store_url: str
) -> Iterator[inproc.Writ]:
    with inproc.writ(tmp_path_factory.mktemp("writ"), inproc_backend, module_store_url) as g:
        yield g


@pytest.fixture(scope="module")
def inproc_sqlite_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    with inproc.acme(tmp_path_factory.mktemp("acme")) as b:
        yield b


@pytest.fixture(scope="module")
def inproc_sqlite_gateway(
    tmp_path_factory: pytest.TempPathFactory, inproc_sqlite_backend: Backend
) -> Iterator[inproc.Writ]:
    """The module's one in-process gateway on SQLite, for cases that are about the gateway, not the store."""
    workdir = tmp_path_factory.mktemp("writ")
    with inproc.writ(workdir, inproc_sqlite_backend, f"sqlite:///{workdir / 'writ.db'}") as g:
        yield g
