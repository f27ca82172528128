"""Counting the transactions a store commits that could have written (its read-only ones left out)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event

from store import Store
from store.db import READ_ONLY


@contextmanager
def write_commits(store: Store) -> Iterator[list[None]]:
    """One entry per COMMIT of a writing transaction while the block runs (the store's reads are
    marked read-only and left out)."""
    seen: list[None] = []

    def count(conn: Any) -> None:
        if not conn.get_execution_options().get(READ_ONLY):
            seen.append(None)

    event.listen(store.engine, "commit", count)
    try:
        yield seen
    finally:
        event.remove(store.engine, "commit", count)
