"""The resume contract under fault injection: no duplicate effect, no lost intent, all settled.

WRIT_FAULT_TRIALS (or `python tests/faults/run.py --trials N`) sets the number of trials; the default
run is the one CI runs.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gateway.faults import POINTS
from tests.e2e.harness import acme_backend, writ
from tests.faults.campaign import Campaign, format_table

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

DEFAULT_TRIALS = 200


async def test_no_crash_or_backend_fault_duplicates_an_effect_or_loses_an_intent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = int(os.environ.get("WRIT_FAULT_TRIALS", DEFAULT_TRIALS))
    with acme_backend(tmp_path) as backend:
        campaign = Campaign(tmp_path, backend, f"sqlite:///{tmp_path / 'writ.db'}")
        token = campaign.token()
        number = 0
        while len(campaign.trials) < target:
            point = POINTS[number % len(POINTS)]
            nth = 2 + (number // len(POINTS)) % 5  # 1-5 backend faults, then the crash
            await campaign.round(number, point, nth, token)
            number += 1
        await campaign.settle(token)
        table = campaign.report()
        verified = writ("audit", "verify", "-c", str(campaign.config()), cwd=tmp_path, check=False)

    with capsys.disabled():
        print(f"\n{format_table(table)}\n")
    assert sum(row["trials"] for row in table.values()) >= target
    for name, row in table.items():
        assert (row["duplicates"], row["lost"], row["unresolved"], row["wrong"]) == (0, 0, 0, 0), name
    assert verified.returncode == 0, verified.stderr
    # Not vacuous: faults after the backend committed left real effects, each recorded as completed.
    for name in ("after_execute", "after_outcome_commit", "backend: commit, drop answer"):
        assert table[name]["effects"] > 0, name
