"""Fixtures shared by every test package."""

from __future__ import annotations

import os

import pytest

POSTGRES_URL = os.environ.get("WRIT_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """The PostgreSQL server the store suite runs against; the suite fails (not skips) when it is down."""
    return POSTGRES_URL
