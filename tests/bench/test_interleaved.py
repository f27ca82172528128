"""`bench/interleaved.py`'s arithmetic and arguments (its runs start gateways: they are for the benchmark,
not the suite)."""

from __future__ import annotations

import math

import pytest

from bench import interleaved


def test_each_round_is_compared_with_the_yardstick_of_the_same_round() -> None:
    # A slow window doubles both targets' blocks in round 2: the round's ratio is unmoved by it.
    writ, bare = [4.0, 8.0, 4.4], [2.0, 4.0, 2.0]
    assert interleaved.median_ratio(writ, bare) == 2.0
    assert interleaved.min_max(writ, bare) == "2.00 to 2.20"


def test_rounds_whose_yardstick_took_no_clock_tick_are_left_out_and_none_left_is_nan() -> None:
    assert interleaved.median_ratio([3.0, 5.0], [0.0, 2.5]) == 2.0
    assert math.isnan(interleaved.median_ratio([3.0, 5.0], [0.0, 0.0]))
    assert interleaved.min_max([3.0], [0.0]) == "-"


def test_blocks_of_different_rounds_are_never_paired() -> None:
    with pytest.raises(ValueError):
        interleaved.median_ratio([1.0, 2.0], [1.0])


def test_scaling_compares_each_round_with_its_own_one_client_block() -> None:
    # A slow window halves both blocks of round 2: its ratio is still 1.5.
    scaling = interleaved.Scaling(8, sequential=[100.0, 50.0, 100.0], concurrent=[150.0, 75.0, 170.0])
    assert scaling.ratio() == 1.5
