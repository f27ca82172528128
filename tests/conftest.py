"""Fixtures shared by every test package."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests import test_types

POSTGRES_URL = os.environ.get("WRIT_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


def pytest_collection_finish(session: pytest.Session) -> None:
    # mypy runs for minutes with a cold cache: start it now, beside the other tests, not after them.
    # Under pytest-xdist every worker collects every test, and the other workers run beside mypy anyway:
    # there the test starts it when it is scheduled, so it runs once.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if any(item.path == Path(test_types.__file__) for item in session.items):
        test_types.mypy()


def pytest_sessionfinish(session: pytest.Session) -> None:
    test_types.stop_mypy()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """The PostgreSQL server the store suite runs against; the suite fails (not skips) when it is down."""
    return POSTGRES_URL
