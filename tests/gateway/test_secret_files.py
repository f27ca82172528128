"""Secrets Writ makes on first use: one wins when processes race, and none is ever read half-written."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.calls.actions import Redactor
from gateway.errors import ConfigurationError
from gateway.secret_files import create_once
from tests.forking import forkserver
from tests.gateway.secret_racers import kid, salted

RACERS = 8
ROUNDS = 6


def test_the_first_creation_wins_and_later_ones_leave_the_file_as_it_is(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "state" / "secret"

    with caplog.at_level(logging.WARNING, logger="gateway.secret_files"):
        assert create_once(path, "first", what="redaction salt") is True
        assert create_once(path, "second", what="redaction salt") is False

    # Said once, by the one that made it: a replica whose secret was not mounted does not make its own
    # in silence.
    assert [r.getMessage() for r in caplog.records] == [
        f"{path} did not exist: made a new redaction salt there (mode 0600)"
    ]

    assert path.read_text() == "first"
    assert path.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == ["secret"]  # no temporary file is left


@pytest.mark.parametrize("load", [salted, kid], ids=["redaction salt", "dev issuer key"])
def test_processes_starting_at_once_on_a_new_volume_all_get_the_one_secret_that_won(
    tmp_path: Path, load: Callable[[str, Any], str]
) -> None:
    # Processes of their own, forked from a server that imported Writ once instead of each importing it.
    context = forkserver()
    with context.Manager() as manager, context.Pool(RACERS) as pool:
        for round_ in range(ROUNDS):  # a race is lost only sometimes: run it a few times
            start, path = manager.Event(), str(tmp_path / f"secret-{round_}")
            pending = [pool.apply_async(load, (path, start)) for _ in range(RACERS)]
            start.set()
            results = {p.get(timeout=60) for p in pending}
            assert len(results) == 1, f"round {round_}: {len(results)} different secrets"


@pytest.mark.parametrize(
    "content", ["", "\n", "not hex at all", "abcd"], ids=["empty", "blank", "text", "short"]
)
def test_a_salt_file_without_a_usable_salt_is_refused_instead_of_salting_with_nothing(
    tmp_path: Path, content: str
) -> None:
    path = tmp_path / "salt"
    path.write_text(content)

    with pytest.raises(ConfigurationError, match=r"holds no salt.*every replica must share"):
        Redactor.from_file(path)


def test_the_directories_a_secret_is_created_in_are_readable_by_their_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "state" / "keys" / "redaction.salt"

    create_once(path, "00" * 32, what="redaction salt")

    modes = {p.name: p.stat().st_mode & 0o777 for p in (path, path.parent, path.parent.parent)}
    assert modes == {"redaction.salt": 0o600, "keys": 0o700, "state": 0o700}
