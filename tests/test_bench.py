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
        # The MCP scenario's Writ rows run with the demo's loop rules and budgets off, then on.
        # Each operation's aims are then measured side by side, in two rounds of three calls a target,
        # and how each target scales, a block from one client and one from two, in two rounds.
        [
            *command,
            *("--no-extras", "--reuse-processes", "--policy-checks", "off,on"),
            *("--interleave", "2", "--interleave-block", "3", "--interleave-clients", "2", "--out", str(out)),
        ],
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

    # After each operation's rows, the bare proxy and Writ on each store took turns, a block each round;
    # the aims are also given from those turns.
    side_by_side = {m["op"]: m for m in report["interleaved"]}
    assert set(side_by_side) == {"read", "write"}
    for op, m in side_by_side.items():
        assert (m["rounds"], m["block"]) == (2, 3)
        assert set(m["targets"]) == {"bare proxy", "sqlite", "postgres"}
        for target in m["targets"].values():
            assert len(target["cpu_per_call_by_round_ms"]) == 2 and target["calls_per_s"] > 0
        assert set(m["scaling"]) == {"bare proxy", "sqlite", "postgres"}
        for scaled in m["scaling"].values():
            assert scaled["clients"] == 2
            assert len(scaled["one_client_calls_per_s_by_round"]) == 2
            assert len(scaled["clients_calls_per_s_by_round"]) == 2
            assert scaled["ratio_median_of_rounds"] > 0
        for store in ("sqlite", "postgres"):
            assert any(aim.startswith(f"MCP {op} on {store}, interleaved: ") for aim in report["aims"])
            scales = f"MCP {op} on {store} with 2 clients, interleaved: "
            assert any(aim.startswith(scales) for aim in report["aims"])
    postgres_against_sqlite = "MCP read on postgres, interleaved: SQLite's calls/s"
    assert any(aim.startswith(postgres_against_sqlite) for aim in report["aims"])

    # Its concurrent rows on PostgreSQL ran again as two Writ processes sharing one store, the
    # clients spread over both, whose CPU is counted together; each is compared with one process.
    replicated = [r for r in mcp if r["replicas"] == 2]
    assert {(r["op"], r["store"], r["concurrency"]) for r in replicated} == {
        ("read", "postgres", 2),
        ("write", "postgres", 2),
    }
    assert all(r["server_cpu_ms_per_call"] and r["pg_wal_syncs_per_call"] is not None for r in replicated)
    for op in ("read", "write"):
        line = f"MCP {op} on postgres, 2 replicas with 2 clients: "
        assert any(aim.startswith(line) for aim in report["aims"])

    # Each Writ row of it ran twice, without and with the policy checks, which counted every call of
    # the rows with them (one budget count each, a loop mark per rule covering it) and none without.
    checked = {
        (r["op"], r["store"], r["concurrency"], r["variant"]["policy_checks"]): r
        for r in mcp
        if r["target"] == "writ" and r["replicas"] == 1
    }
    assert len(checked) == 16
    for (op, _, _, checks), row in checked.items():
        if checks == "off":
            assert row["budget_counted_per_call"] == 0 and row["loop_marks_per_call"] == 0
            assert row["on_vs_off_calls_per_s"] is None
        else:
            assert row["budget_counted_per_call"] == 1
            # same-call-repeated and same-failure-repeated cover both; refunds-differing-in-amount refunds
            assert row["loop_marks_per_call"] == (3 if op == "write" else 2)
            assert row["on_vs_off_calls_per_s"] is not None and row["on_vs_off_cpu"] is not None
    pairs = {(p["op"], p["store"], p["concurrency"]) for p in report["policy_checks"]}
    assert pairs == {
        (op, store, c) for op in ("read", "write") for store in ("sqlite", "postgres") for c in (1, 2)
    }
    assert "| read via Writ -> MCP | sqlite | 1 | " in completed.stdout.split("Policy checks")[1]
