"""The benchmark keeps working: a tiny run of `bench/run.py` measures every scenario and reports the aims.

It asserts what the run produced, never how fast: speed is for the benchmark's own report.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]


@pytest.mark.timeout(900)  # the benchmark runs up to 600 s, and a store suite before it
def test_a_small_benchmark_run_measures_every_scenario_on_both_stores(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    command = [sys.executable, "bench/run.py", "--calls", "5", "--warmup", "2", "--concurrency", "2"]
    completed = subprocess.run(
        # One gateway per store serves all its rows: this checks the benchmark runs, not its figures.
        [*command, "--no-extras", "--reuse-processes", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]

    report = json.loads(out.read_text())
    scenarios = {(r["op"], r["target"], r["store"], r["mode"], r["concurrency"]) for r in report["rows"]}
    for store in ("sqlite", "postgres"):
        for op in ("read", "write"):
            assert (op, "writ", store, "2026-07-28", 1) in scenarios
            assert (op, "writ", store, "2025-11-25", 1) in scenarios
            assert (op, "writ", store, "2026-07-28", 2) in scenarios
    assert {("read", "direct", "-", "HTTP", 1), ("write", "bare", "-", "2026-07-28", 1)} <= scenarios
    assert all(r["calls"] == 5 and r["calls_per_s"] > 0 for r in report["rows"])
    assert all(r["ratio_vs_direct"] is not None for r in report["rows"] if r["target"] != "direct")
    assert [line.split(":")[0] for line in report["aims"][:4]] == [
        "read on sqlite",
        "write on sqlite",
        "read on postgres",
        "write on postgres",
    ]
    assert "| read via Writ | sqlite | 2026-07-28 | 1 | 5 |" in completed.stdout

    # Issue 16's scenario: an upstream MCP server, reached directly, through the bare proxy and Writ.
    mcp = [r for r in report["rows"] if r["upstream"] == "mcp"]
    reached = {(r["op"], r["target"], r["store"], r["concurrency"]) for r in mcp}
    for op in ("read", "write"):
        for concurrency in (1, 2):
            assert {(op, "direct", "-", concurrency), (op, "bare", "-", concurrency)} <= reached
            assert {(op, "writ", "sqlite", concurrency), (op, "writ", "postgres", concurrency)} <= reached
    assert all(r["ratio_vs_bare"] is not None for r in mcp if r["target"] == "writ")
    assert any(line.startswith("MCP read on postgres: ") for line in report["aims"])
