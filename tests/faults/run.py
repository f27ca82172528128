"""Run the fault campaign with more trials than CI does: `python tests/faults/run.py --trials 2000`.

`--store` picks the store it runs on: sqlite, postgres (a fresh schema on WRIT_TEST_POSTGRES_URL's
server, dropped after) or both (the default), one after the other. Runs the crash campaign (every
fault, `--trials` per store) and the slow-backend campaign (`--slow-trials` per store, and as many
through two replicas on PostgreSQL). `--partition-by tenant` runs the gateways on a log partitioned by
tenant (store.log.partition_by). Prints each run's table (fault, trials, effects, duplicates,
lost, unresolved, wrong); exits non-zero if any invariant broke. Other arguments go to pytest.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STORES = {"sqlite": "sqlite", "postgres": "postgres", "both": "sqlite or postgres"}
"""The test's parameter ids each choice selects (by `pytest -k`)."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200, help="trials per store (default: 200)")
    parser.add_argument("--store", choices=list(STORES), default="both")
    parser.add_argument(
        "--slow-trials", type=int, default=None, help="slow-backend trials per run (default: --trials / 2)"
    )
    parser.add_argument(
        "--partition-by", choices=["none", "tenant"], default="none", help="the log's partitions (store.log)"
    )
    args, pytest_args = parser.parse_known_args()
    os.environ["WRIT_FAULT_PARTITION_BY"] = args.partition_by  # the rest goes to pytest, e.g. --basetemp=DIR
    os.environ["WRIT_FAULT_TRIALS"] = str(args.trials)
    os.environ["WRIT_SLOW_TRIALS"] = str(
        args.slow_trials if args.slow_trials is not None else args.trials // 2
    )
    os.chdir(REPO)
    sys.path.insert(0, str(REPO))
    tests = ["tests/faults/test_crash_safety.py", "tests/faults/test_slow_backend.py"]
    return int(pytest.main(["-q", *tests, "-k", STORES[args.store], *pytest_args]))


if __name__ == "__main__":
    sys.exit(main())
