"""The conformance suite against the reference server and through Writ in one run, both protocol versions.

The reference is the MCP Python SDK's conformance server (`examples/servers/everything-server` in its
repository, not published on a registry): pass a checkout of that directory. It runs on the Python
that runs this script (the repository's venv has the `mcp`, click, starlette and uvicorn it imports).
Writ's side is tests/e2e/test_conformance.py (the demo plus the fixture upstream), run by pytest.

    .venv/bin/python conformance/parity.py /path/to/python-sdk/examples/servers/everything-server

Prints, for each protocol version, the checks passed of those run by each server (as the test counts:
only SUCCESS passes), then every check the reference passes and Writ does not, with the reason
`conformance/expected-failures.yaml` gives ("NOT LISTED" if none; a check Writ's run never reached
says so). Exits 1 if Writ's test failed, which it also does on a check that is not listed.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.e2e.conformance_suite import (  # noqa: E402  (the repository is put on the path above)
    Check,
    Suite,
    load_expected_failures,
    passed,
    read_checks,
)

VERSIONS = ("2025-11-25", "2026-07-28")
WRIT_TEST = (
    "tests/e2e/test_conformance.py::"
    "test_every_conformance_check_passes_on_both_protocols_except_the_listed_expected_failures"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_reference(server_dir: Path, out: Path) -> dict[str, list[Check]]:
    """Start the reference server from `server_dir`, run the suite against it for each version."""
    port = free_port()
    log = (out / "reference.log").open("w")
    command = [sys.executable, "-m", "mcp_everything_server", "--port", str(port)]
    server = subprocess.Popen(command, cwd=server_dir, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.5).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    sys.exit(f"the reference server did not start: see {out / 'reference.log'}")
                time.sleep(0.2)
        suite = Suite.installed()
        # It ignores the Authorization header the suite is given for Writ.
        url = f"http://localhost:{port}/mcp"
        return {v: suite.run(url, "unused", v, out / "reference" / v) for v in VERSIONS}
    finally:
        server.terminate()
        server.wait(10)
        log.close()


def run_writ(out: Path) -> tuple[int, dict[str, list[Check]]]:
    """Writ's conformance test, keeping the suite's output; its exit code and the checks."""
    base = out / "writ"
    command = [sys.executable, "-m", "pytest", "-q", WRIT_TEST, f"--basetemp={base}"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    checks: dict[str, list[Check]] = {}
    for version in VERSIONS:
        found = sorted(base.glob(f"*/out-{version}"))
        if not found:
            sys.exit(f"Writ's conformance test left no output for {version}:\n{done.stdout[-3000:]}")
        checks[version] = read_checks(version, found[0])
    return done.returncode, checks


def passing(checks: Iterable[Check]) -> dict[tuple[str, str], bool]:
    """(scenario, check id) -> whether every run of it passed."""
    result: dict[tuple[str, str], bool] = {}
    for c in checks:
        result[c.key] = result.get(c.key, True) and c.status == "SUCCESS"
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("reference", type=Path, help="the SDK's examples/servers/everything-server directory")
    args = parser.parse_args()
    if not (args.reference / "mcp_everything_server" / "server.py").exists():
        sys.exit(f"{args.reference} has no mcp_everything_server/server.py")
    expected = load_expected_failures()
    with tempfile.TemporaryDirectory(prefix="writ-parity-") as scratch:
        out = Path(scratch)
        reference = run_reference(args.reference.resolve(), out)
        code, writ = run_writ(out)
        pinned = json.loads((REPO / "conformance" / "package.json").read_text())["dependencies"]
        print(
            f"{time.strftime('%Y-%m-%d', time.gmtime())}, suite {pinned['@modelcontextprotocol/conformance']}"
        )
        for version in VERSIONS:
            r, w = reference[version], writ[version]
            print(f"{version}: reference {passed(r)} of {len(r)} pass, Writ {passed(w)} of {len(w)}")
        for version in VERSIONS:
            ours = passing(writ[version])
            for key, ok in sorted(passing(reference[version]).items()):
                if ok and not ours.get(key, False):
                    scenario, check_id = key
                    reason = expected.get(key) or expected.get((f"{scenario}@{version}", check_id))
                    if key not in ours:  # the scenario stopped at an earlier check through Writ
                        reason = "not run through Writ (its scenario stopped before it)"
                    print(f"  {version} {scenario}/{check_id}: {reason or 'NOT LISTED'}")
        if code:
            print("Writ's conformance test failed: run it for its message", file=sys.stderr)
    return 1 if code else 0


if __name__ == "__main__":
    raise SystemExit(main())
