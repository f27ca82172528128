"""Rate-limit configuration: clear errors for limits that cannot work or name no tool."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from capabilities.fake import fake_capability
from gateway.calls.rate_limits import RateLimiter, RateLimitsConfig
from gateway.config import load_config
from gateway.errors import ConfigurationError
from policy.model import Principal


@pytest.mark.parametrize(
    ("limits", "problem"),
    [
        ({"per_s": 0}, "rate_limits.per_s: Input should be greater than 0"),
        ({"burst": 0}, "rate_limits.burst: Input should be greater than or equal to 1"),
        ({"tenants": {"acme": {"per_s": 1}}}, "rate_limits.tenants.acme.burst: Field required"),
        ({"per_second": 5}, "rate_limits.per_second: Extra inputs are not permitted"),
    ],
)
def test_a_rate_limit_that_cannot_work_is_refused_with_the_field_named(
    tmp_path: Path, limits: dict[str, object], problem: str
) -> None:
    path = tmp_path / "writ.yaml"
    path.write_text(yaml.safe_dump({"rate_limits": limits}))
    with pytest.raises(ConfigurationError) as refused:
        load_config(path)
    assert problem in str(refused.value)


def test_a_limit_for_a_tool_no_capability_has_is_refused() -> None:
    limiter = RateLimiter(
        RateLimitsConfig(capabilities={"refund_ordr": {"per_s": 1, "burst": 1}}), lambda b, n: None
    )
    with pytest.raises(ConfigurationError, match="no capability has the tool refund_ordr"):
        limiter.check_tools(["refund_order", "lookup_order"])


def test_principals_with_separators_in_their_names_never_share_a_bucket() -> None:
    limiter = RateLimiter(RateLimitsConfig(), lambda b, n: None)
    cap = fake_capability("refund_order")
    one = limiter.buckets(Principal("b\x1fc", tenant="a"), cap)
    two = limiter.buckets(Principal("c", tenant="a\x1fb"), cap)
    assert one[0].key != two[0].key and len(one[0].key) == 64


def test_disabled_rate_limits_draw_on_no_bucket() -> None:
    limiter = RateLimiter(RateLimitsConfig(enabled=False), lambda b, n: None)
    assert limiter.buckets(Principal("alice", tenant="acme"), fake_capability("refund_order")) == []
