"""The keys that seal confirmation rounds: read from a file, rotated without refusing an answer."""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp.server.request_state import InvalidRequestState

from gateway.errors import ConfigurationError
from gateway.mcp.rounds import read_keys, sealing

OLD, NEW = b"o" * 40, b"n" * 40


def test_each_non_empty_line_of_the_key_file_is_a_key_without_its_surrounding_whitespace(
    tmp_path: Path,
) -> None:
    path = tmp_path / "keys"
    path.write_bytes(b"  " + NEW + b"\r\n\n" + OLD + b"\t\n")

    assert read_keys(path) == (NEW, OLD)


@pytest.mark.parametrize(
    ("content", "problem"),
    [(b"", "holds no key"), (b"\n  \n", "holds no key"), (NEW + b"\ntoo-short\n", "line 2 of")],
)
def test_a_key_file_without_fit_keys_is_refused_naming_the_problem_not_the_key(
    tmp_path: Path, content: bytes, problem: str
) -> None:
    path = tmp_path / "keys"
    path.write_bytes(content)

    with pytest.raises(ConfigurationError, match=problem) as refused:
        read_keys(path)
    assert "too-short" not in str(refused.value)


def test_a_missing_key_file_is_refused_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"cannot read .*missing"):
        read_keys(tmp_path / "missing")


def test_a_key_given_twice_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="duplicates"):
        sealing(600, (NEW, NEW))


def test_state_sealed_under_the_old_key_opens_after_a_new_first_key_is_added_and_not_once_it_is_dropped() -> (
    None
):
    token = sealing(600, (OLD,)).codec.seal(b"state")

    assert sealing(600, (NEW, OLD)).codec.unseal(token) == b"state"
    with pytest.raises(InvalidRequestState):
        sealing(600, (NEW,)).codec.unseal(token)
    assert sealing(600, (NEW,)).codec.unseal(sealing(600, (NEW, OLD)).codec.seal(b"x")) == b"x"  # first seals


def test_without_keys_each_sealing_has_a_key_of_its_own() -> None:
    token = sealing(600).codec.seal(b"state")

    with pytest.raises(InvalidRequestState):
        sealing(600).codec.unseal(token)
