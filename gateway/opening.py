"""What the composition root and the CLI both open from a config: the store and the dev issuer.

Apart from `gateway.app` so that a store command of the CLI loads no server stack (MCP server,
Starlette, telemetry SDK), which is most of its start-up.
"""

from __future__ import annotations

import logging
from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from gateway.auth.dev_issuer import DevIssuer
from gateway.config import WritConfig
from gateway.errors import ConfigurationError
from store.partitions import Partitioning
from store.store import PRODUCER, Store

logger = logging.getLogger("gateway.app")  # the name operators' log filters know these messages by


def open_store(config: WritConfig, *, migrate_empty: bool = True, producer: str = PRODUCER) -> Store:
    """Open the configured store, recording as `producer`; an empty database is migrated, an outdated
    one is refused.

    Raises:
        ConfigurationError: the database holds an older schema (run `writ store migrate`), or, with
            `migrate_empty` false, nothing (a SQLite file not there yet is then not created).
    """
    if not migrate_empty and missing_sqlite_file(config.store.url):
        raise ConfigurationError(_nothing_recorded(config.store.url))
    store = Store.open(
        config.store.url,
        durable=config.store.durable,
        idle_transaction_timeout_s=config.store.idle_transaction_timeout_s,
        pool_size=config.store.pool_size,
        max_overflow=config.store.max_overflow,
        producer=producer,
        partitioning=Partitioning(config.store.log.partition_by, config.store.log.buckets),
    )
    if not store.is_migrated():
        empty = store.is_empty()
        if migrate_empty and empty:
            store.migrate()
            return store
        store.close()
        where = _safe_url(config.store.url)
        if empty:
            raise ConfigurationError(_nothing_recorded(config.store.url))
        raise ConfigurationError(f"the store at {where} needs a migration: run `writ store migrate`")
    return store


def missing_sqlite_file(url: str) -> bool:
    """Whether `url` names a SQLite file that does not exist (connecting would create it, empty)."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return False  # Store.open says what is wrong with it
    database = parsed.database
    if not parsed.drivername.startswith("sqlite") or not database or database == ":memory:":
        return False
    return not Path(database).exists()


def _nothing_recorded(url: str) -> str:
    return (
        f"nothing is recorded at {_safe_url(url)} yet: `writ serve` or `writ demo` create the store "
        "(or pass -c with the config of the gateway you mean)"
    )


def dev_issuer_for(config: WritConfig) -> DevIssuer | None:
    if not config.auth.dev_issuer.enabled:
        return None
    if config.auth.issuers:
        # Beside a real identity provider, a local key that mints any identity is a side door.
        logger.warning(
            "auth.dev_issuer is enabled beside %d configured issuer(s): anyone who can read %s or run "
            "`writ token` here can mint tokens for any subject, tenant and role; turn it off for production",
            len(config.auth.issuers),
            config.auth.dev_issuer.key_file,
        )
    return DevIssuer.load_or_create(config.auth.dev_issuer.key_file, f"{config.server.base_url}/dev-issuer")


def _safe_url(url: str) -> str:
    """A database URL without its password, for messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:  # a malformed URL is reported by the store itself
        return "<store url>"
