"""A backend slow *before* it commits: one effect per intent and a log that agrees with the backend.

The refund is held in a queue past the call's timeout, or the backend is frozen with it read, and runs
after the reconciler's first lookups found nothing. The calls carry no idempotency key and the model
re-sends each one, at once and after its verdict. On SQLite, on PostgreSQL, and on PostgreSQL with two
replicas (the re-send goes through the other one). WRIT_SLOW_TRIALS sets the number of trials per
store; the default run (the test command's and CI's) is the shortest that meets every kind of delay.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.e2e.harness import Backend
from tests.faults.campaign import SLOW_FAULTS, Campaign, explain, format_table

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

DEFAULT_TRIALS = 8
"""Four refunds held 0.55 to 2 s (before, between and after the reconciler's lookups) and four freezes
of 0.9 and 1.6 s, alternating; on two replicas each sends first four times. More repeat these delays."""
TRIALS = int(os.environ.get("WRIT_SLOW_TRIALS", DEFAULT_TRIALS))
# A campaign runs as long as its trials (2 to 2.6 s each at load 10): 20 s a trial is only ever a hang.
CAMPAIGN_TIMEOUT = pytest.mark.timeout(max(600, 20 * TRIALS))


@CAMPAIGN_TIMEOUT
@pytest.mark.parametrize(
    "replicas",
    [
        pytest.param(0, id="sqlite"),
        pytest.param(1, id="postgres", marks=pytest.mark.postgres),
        pytest.param(2, id="postgres-2-replicas", marks=pytest.mark.postgres),
    ],
)
async def test_a_backend_slow_before_it_commits_gets_one_effect_and_a_true_verdict(
    tmp_path: Path,
    backend: Backend,
    request: pytest.FixtureRequest,
    replicas: int,
    capsys: pytest.CaptureFixture[str],
) -> None:
    target = TRIALS
    store_url = request.getfixturevalue("pg_url") if replicas else f"sqlite:///{tmp_path / 'writ.db'}"
    campaign = Campaign(tmp_path, backend, store_url)
    await campaign.run_slow(target, replicas=max(replicas, 1))
    table = campaign.report()

    with capsys.disabled():
        print(f"\n{format_table(table)}\n")
    assert set(table) == set(SLOW_FAULTS)
    for name, row in table.items():
        broken = (row["duplicates"], row["lost"], row["unresolved"], row["wrong"])
        assert broken == (0, 0, 0, 0), explain(campaign, name)
        # Not vacuous: the late refunds happened, and every re-send was made and heard.
        assert row["effects"] == row["trials"], name
    # Every call was re-sent at once, and (within its dedupe window) again after its verdict.
    assert all(trial.resends for trial in campaign.trials)
    assert any(len(trial.resends) == 2 for trial in campaign.trials)
