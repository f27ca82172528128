"""Which loop patterns a call belongs to: what a rule ignores, whose calls share one, which window."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from policy import Policy, PolicyError

from .helpers import LOOKUP, call, principal

ALLOW_ALL = {"id": "allow-all", "decision": "allow"}


def _policy(*loops: dict[str, Any]) -> Policy:
    return Policy.from_mapping({"rules": [ALLOW_ALL], "loops": list(loops)})


def _pattern(policy: Policy, **arguments: Any) -> str:
    (mark,) = policy.loop_marks(call(**arguments))
    return mark.pattern


def test_a_near_identical_rule_ignores_only_the_fields_it_names() -> None:
    policy = _policy({"id": "refunds", "ignore": ["amount"], "threshold": 3})

    one_cent_apart = (
        _pattern(policy, order_id="1", amount=10.00),
        _pattern(policy, order_id="1", amount=10.01),
    )
    other_order = _pattern(policy, order_id="2", amount=10.00)

    assert one_cent_apart[0] == one_cent_apart[1]
    assert other_order != one_cent_apart[0]
    (mark,) = policy.loop_marks(call(order_id="1"))
    assert (mark.kind, mark.threshold, mark.window_s) == ("near_identical", 3, 600)


def test_a_repeated_action_rule_tells_apart_any_difference_and_any_principal() -> None:
    policy = _policy({"id": "same", "threshold": 3})

    assert _pattern(policy, order_id="1", amount=10) != _pattern(policy, order_id="1", amount=11)
    (bob,) = policy.loop_marks(call(who=principal("agent", subject="bob"), order_id="1", amount=10))
    assert bob.pattern != _pattern(policy, order_id="1", amount=10)


def test_a_failure_rule_counts_a_capability_whatever_its_arguments() -> None:
    policy = _policy({"id": "failing", "count": "failures"})

    assert _pattern(policy, order_id="1") == _pattern(policy, order_id="2")
    (lookup,) = policy.loop_marks(call(LOOKUP, order_id="1"))
    assert lookup.pattern != _pattern(policy, order_id="1")
    assert lookup.kind == "repeated_failure"


def test_windows_are_fixed_and_aligned_and_scoping_is_a_rules() -> None:
    policy = _policy({"id": "refunds-only", "tools": ["refund_order"], "window": "1h"})
    late = datetime(2025, 6, 1, 12, 59, 59, tzinfo=UTC)

    (mark,) = policy.loop_marks(call(now=late, order_id="1"))

    assert (mark.window_start, mark.resets_at) == (
        datetime(2025, 6, 1, 12, tzinfo=UTC),
        datetime(2025, 6, 1, 13, tzinfo=UTC),
    )
    assert policy.loop_marks(call(LOOKUP, order_id="1")) == ()
    assert _policy().loop_marks(call(order_id="1")) == ()


@pytest.mark.parametrize(
    ("loop", "problem"),
    [
        ({"id": "x", "threshold": 0}, "loop 'x'.*threshold"),
        ({"id": "x", "window": "soon"}, "loop 'x'.*window"),
        ({"id": "x", "ignore": [""]}, "loop 'x'.*ignore"),
        ({"id": "x", "count": "failures", "ignore": ["amount"]}, "loop 'x'.*ignores every argument"),
        ({"id": "x", "tresholds": 3}, "loop 'x'.*tresholds"),
    ],
)
def test_a_bad_loop_rule_is_refused_at_load_naming_it(loop: dict[str, Any], problem: str) -> None:
    with pytest.raises(PolicyError, match=problem):
        _policy(loop)


def test_loop_ids_are_unique_and_a_policy_without_loops_keeps_its_version() -> None:
    with pytest.raises(PolicyError, match="loop 'x'.*more than one"):
        _policy({"id": "x"}, {"id": "x"})
    assert Policy.from_mapping({"rules": [ALLOW_ALL]}).version == _policy().version
    assert _policy({"id": "x"}).version != _policy().version
