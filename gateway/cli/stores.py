"""The store a CLI command works on."""

from __future__ import annotations

from gateway.cli.authority import CLI
from gateway.cli.clock import CLOCK
from gateway.config import WritConfig
from gateway.opening import open_store
from store import Store


def opened_store(config: WritConfig) -> Store:
    """The configured store (migrated, else refused: a command never creates one), recording as the CLI,
    with the CLI's clock set by the database's (`gateway.cli.clock`). Close it after the command."""
    store = open_store(config, migrate_empty=False, producer=CLI)
    try:
        CLOCK.measure(store.database_time)
    except BaseException:
        store.close()
        raise
    return store
