"""Run the fault campaign with more trials than CI does: `python tests/faults/run.py --trials 2000`.

Prints the table (fault, trials, duplicates, lost, unresolved, wrong); exits non-zero if any invariant
broke.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    args = parser.parse_args()
    os.environ["WRIT_FAULT_TRIALS"] = str(args.trials)
    os.chdir(REPO)
    sys.path.insert(0, str(REPO))
    return int(pytest.main(["-q", "-x", "tests/faults/test_crash_safety.py"]))


if __name__ == "__main__":
    sys.exit(main())
