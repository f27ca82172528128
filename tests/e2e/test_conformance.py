"""The official MCP conformance suite against a real `writ serve`, for both protocol versions.

The gateway has the demo config plus an upstream MCP server with the suite's content fixtures
(tests/e2e/conformance_upstream.py) and one with its input-required fixtures, spoken to in 2026-07-28
(tests/e2e/conformance_rounds_upstream.py), so the suite sees both Writ's own tools and relayed ones. Every
check either passes or is listed, with its reason, in conformance/expected-failures.yaml. The suite
comes from npm: `npm ci --prefix conformance` (which scripts/test does).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e import conformance_rounds_upstream
from tests.e2e.conformance_suite import (
    EXPECTED_FAILURES,
    Check,
    Suite,
    SuiteNotInstalled,
    load_expected_failures,
    passed,
    problems,
)
from tests.e2e.conformance_upstream import TOOLS
from tests.e2e.harness import Backend, Gateway, writ_gateway

VERSIONS = ("2025-11-25", "2026-07-28")
# The checks that pass today, so a run that silently checks less (a scenario that crashed before its
# checks, a suite that ran nothing) fails even though nothing in it failed. Raise it as checks are fixed.
MIN_PASSED = {"2025-11-25": 81, "2026-07-28": 165}
UPSTREAM = Path(__file__).with_name("conformance_upstream.py")


@pytest.fixture
def suite() -> Suite:
    """The installed suite; checked before any process starts."""
    try:
        return Suite.installed()
    except SuiteNotInstalled as exc:
        pytest.fail(str(exc))


@pytest.fixture
def conformance_gateway(tmp_path: Path, backend: Backend) -> Iterator[Gateway]:
    """The demo on SQLite (the store plays no part in what the suite checks) and the fixture upstream."""
    # 2025-11-25 to the upstream: Writ hears an upstream's list changes on that era's standing stream.
    fixtures = {
        "type": "mcp",
        "command": [sys.executable, str(UPSTREAM)],
        "mode": "legacy",
        "resources": True,
        "prompts": True,
    }
    # 2026-07-28: its input-required rounds become Writ's rounds for a 2026-07-28 client.
    rounds = {
        "type": "mcp",
        "command": [sys.executable, conformance_rounds_upstream.__file__],
        "mode": "2026-07-28",
        "prompts": True,
    }
    rules = [
        {
            "id": "agents-call-fixtures",
            "tools": [t.name for t in [*TOOLS, *conformance_rounds_upstream.TOOLS]],
            "roles": ["agent"],
            "decision": "allow",
        },
        {"id": "agents-read-fixtures", "resources": ["test://*"], "roles": ["agent"], "decision": "allow"},
        {"id": "agents-get-fixture-prompts", "prompts": ["test_*"], "roles": ["agent"], "decision": "allow"},
    ]
    store = f"sqlite:///{tmp_path / 'writ.db'}"
    with writ_gateway(
        tmp_path, backend, store, extra_backends={"fixtures": fixtures, "rounds": rounds}, extra_rules=rules
    ) as g:
        yield g


@pytest.mark.e2e
@pytest.mark.timeout(900)  # the official suite, once per protocol version
def test_every_conformance_check_passes_on_both_protocols_except_the_listed_expected_failures(
    suite: Suite, conformance_gateway: Gateway, tmp_path: Path
) -> None:
    gateway = conformance_gateway
    token = gateway.token("conformance-agent")
    expected = load_expected_failures()

    checks: list[Check] = []
    counts: dict[str, tuple[int, int, float]] = {}
    for version in VERSIONS:
        started = time.monotonic()
        ran = suite.run(gateway.mcp_url, token, version, tmp_path / f"out-{version}")
        counts[version] = (passed(ran), len(ran), time.monotonic() - started)
        checks += ran

    summary = ", ".join(f"{v}: {p} of {n} checks passed in {s:.1f}s" for v, (p, n, s) in counts.items())
    found = problems(checks, expected)
    assert not found, f"{summary}; not as in {EXPECTED_FAILURES.name}:\n" + "\n".join(found)
    for version, (n_passed, _, _) in counts.items():
        assert n_passed >= MIN_PASSED[version], f"{summary}; fewer than {MIN_PASSED[version]} on {version}"


def check(status: str, scenario: str = "tools-list", check_id: str = "tools-list") -> Check:
    return Check("2026-07-28", scenario, check_id, status, "a message")


def test_a_passing_check_that_is_not_listed_is_no_problem() -> None:
    assert problems([check("SUCCESS")], {}) == []


@pytest.mark.parametrize("status", ["FAILURE", "WARNING", "SKIPPED", "INFO"])
def test_a_check_that_does_not_pass_and_is_not_listed_is_a_problem(status: str) -> None:
    assert problems([check(status)], {}) == [f"2026-07-28 tools-list/tools-list {status}: a message"]


@pytest.mark.parametrize("status", ["FAILURE", "WARNING", "SKIPPED", "INFO"])
def test_a_listed_check_that_does_not_pass_is_no_problem(status: str) -> None:
    assert problems([check(status)], {("tools-list", "tools-list"): "why"}) == []


def test_a_listed_check_that_passes_is_a_problem_that_says_to_remove_it() -> None:
    found = problems([check("SUCCESS")], {("tools-list", "tools-list"): "why"})
    assert found == [
        "2026-07-28 tools-list/tools-list now passes: remove it from conformance/expected-failures.yaml"
    ]


def test_a_check_run_several_times_passes_only_if_every_run_passed() -> None:
    assert problems([check("SUCCESS"), check("FAILURE"), check("SUCCESS")], {}) == [
        "2026-07-28 tools-list/tools-list FAILURE: a message"
    ]


def test_a_check_listed_for_one_version_is_expected_to_fail_on_that_version_only() -> None:
    expected = {("tools-list@2026-07-28", "tools-list"): "why"}
    other = Check("2025-11-25", "tools-list", "tools-list", "FAILURE", "a message")
    assert problems([check("FAILURE"), other], expected) == [
        "2025-11-25 tools-list/tools-list FAILURE: a message"
    ]
    assert problems([check("SUCCESS")], expected) == [
        "2026-07-28 tools-list/tools-list now passes: remove it from conformance/expected-failures.yaml"
    ]


def test_a_listed_check_the_suite_did_not_run_is_a_problem() -> None:
    found = problems([check("SUCCESS")], {("ping", "ping"): "why"})
    assert found == ["ping/ping did not run: remove it from conformance/expected-failures.yaml"]


def test_a_status_the_suite_did_not_have_before_is_a_problem() -> None:
    assert problems([check("ERROR")], {("tools-list", "tools-list"): "why"}) == [
        "2026-07-28 tools-list/tools-list: unknown status ERROR"
    ]
