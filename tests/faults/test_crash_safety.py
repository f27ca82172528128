"""The resume contract under fault injection: no duplicate effect, no lost intent, all settled.

The same campaign runs on each store; on PostgreSQL each round also cuts the database connection of
one call in flight. WRIT_FAULT_TRIALS (or `python tests/faults/run.py --trials N`) sets the number of
trials per store; the default run (the test command's and CI's) is the shortest that meets every fault.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from gateway.calls.faults import POINTS
from tests.e2e.harness import acme_backend, writ
from tests.faults.campaign import STORE_FAULTS, Campaign, format_table
from tests.faults.plug import Plug, plugged

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

DEFAULT_TRIALS = 15
"""Three rounds on each store, one per crash point, each with four backend faults before its crash (and
on PostgreSQL a store cut): each crash point, backend fault and store cut at least once (the assertion
on the table's rows checks it). More trials repeat these kinds with other counts."""
TRIALS = int(os.environ.get("WRIT_FAULT_TRIALS", DEFAULT_TRIALS))
# A campaign runs as long as its trials (2 to 2.6 s each at load 10): 20 s a trial is only ever a hang.
CAMPAIGN_TIMEOUT = pytest.mark.timeout(max(600, 20 * TRIALS))


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Plug | None]]:
    """The store URL, and on PostgreSQL (a fresh schema, dropped after) the plug the gateway goes through."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'writ.db'}", None
        return
    url: str = request.getfixturevalue("pg_url")
    with plugged(make_url(url).port or 5432) as plug:
        yield url, plug


@CAMPAIGN_TIMEOUT
async def test_no_crash_or_backend_fault_duplicates_an_effect_or_loses_an_intent(
    tmp_path: Path, store: tuple[str, Plug | None], capsys: pytest.CaptureFixture[str]
) -> None:
    target = TRIALS
    store_url, plug = store
    with acme_backend(tmp_path) as backend:
        campaign = Campaign(tmp_path, backend, store_url, plug)
        await campaign.run(target, campaign.token())
        table = campaign.report()
        verified = writ("audit", "verify", "-c", str(campaign.config()), cwd=tmp_path, check=False)

    with capsys.disabled():
        print(f"\n{format_table(table)}\n")
    assert sum(row["trials"] for row in table.values()) >= target
    for name, row in table.items():
        assert (row["duplicates"], row["lost"], row["unresolved"], row["wrong"]) == (0, 0, 0, 0), name
    assert verified.returncode == 0, verified.stderr
    # Not vacuous: faults after the backend committed left real effects, each recorded as completed.
    after_commit = ("after_execute", "after_outcome_commit", "backend: commit, drop answer")
    for name in after_commit + (tuple(STORE_FAULTS) if plug else ()):
        assert table[name]["effects"] > 0, name
    assert set(table) == {*POINTS, *campaign.faults}
