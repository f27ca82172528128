"""The relay the outage tests pull: pulling it ends PostgreSQL's side of each session too."""

from __future__ import annotations

import secrets

import psycopg
import pytest
from sqlalchemy.engine import make_url

from tests.faults.plug import plugged, through

pytestmark = [pytest.mark.postgres]


def test_pulling_the_plug_ends_the_relayed_session_and_frees_the_locks_it_held(postgres_url: str) -> None:
    key = secrets.randbits(62)
    port = make_url(postgres_url).port or 5432
    with plugged(port) as plug:
        relayed = psycopg.connect(through(plug, postgres_url))
        try:
            relayed.execute("SELECT pg_advisory_xact_lock(%s)", (key,))  # held until the transaction ends
            plug.pull()
            with psycopg.connect(postgres_url, autocommit=True) as direct:
                # Well inside any server-side timeout: only a session the server saw end lets go this soon.
                direct.execute("SET lock_timeout = '5s'")
                direct.execute("SELECT pg_advisory_lock(%s)", (key,))
                direct.execute("SELECT pg_advisory_unlock(%s)", (key,))
            with pytest.raises(psycopg.OperationalError):
                relayed.execute("SELECT 1")
        finally:
            relayed.close()
