"""`writ audit export`: its filters and cursor over a log of several tenants, JSON lines as the store
exports them, clear refusals of bad filters, and `--follow` writing what commits later until stopped."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from typer.testing import CliRunner

from gateway.audit.exporting import follow
from gateway.cli.main import app
from store import EventFilter, Store
from tests.eventually import eventually_sync
from tests.gateway.cli.test_cli_audit import config_for
from tests.postgres import fresh_store
from tests.store.builders import NOW
from tests.store.test_export import HOUR, call, several_tenants


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def logged(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Path, Store]]:
    """A config naming a store of either kind with two tenants' calls."""
    with fresh_store(request, tmp_path) as (url, store):
        several_tenants(store)
        yield config_for(tmp_path, url), store


def export(config: Path, *args: str) -> Result:
    return CliRunner().invoke(app, ["audit", "export", "-c", str(config), *args])


def lines(result: Result) -> list[dict[str, Any]]:
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_the_filters_select_what_the_store_selects(logged: tuple[Path, Store]) -> None:
    config, store = logged
    wanted = EventFilter(tenant="acme", types=("tool_call.*",), subject="alice", since=NOW + HOUR)

    printed = lines(
        export(
            config,
            "--tenant",
            "acme",
            "--type",
            "tool_call.*",
            "--principal",
            "alice",
            "--since",
            (NOW + HOUR).isoformat(),
        )
    )

    assert printed == json.loads(json.dumps(list(store.export(wanted)), default=str))
    assert {(e["tenant"], e["tool_call_id"]) for e in printed} == {("acme", "tc-a2")}
    assert {e["type"] for e in printed} == {
        "tool_call.requested",
        "tool_call.dispatching",
        "tool_call.failed",
    }


def test_with_no_filter_every_event_is_one_line_in_seq_order(logged: tuple[Path, Store]) -> None:
    config, store = logged

    printed = lines(export(config))

    assert [e["seq"] for e in printed] == list(range(1, len(list(store.export())) + 1))
    assert {e["tenant"] for e in printed} == {"acme", "globex"}


def test_after_seq_and_capability_and_until_narrow_it(logged: tuple[Path, Store]) -> None:
    config, _ = logged

    printed = lines(
        export(
            config,
            "--after-seq",
            "4",
            "--capability",
            "refund-order",
            "--until",
            (NOW + 3 * HOUR).isoformat(),
        )
    )

    assert printed and all(e["seq"] > 4 for e in printed)
    assert {e["tool_call_id"] for e in printed} - {None} == {"tc-g1"}


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--since", "yesterday"), "since: 'yesterday' is not an ISO 8601 time"),
        (("--until", "2026-12-01T00:00:00"), "until: '2026-12-01T00:00:00' needs an offset"),
        (("--type", "tool_call.%"), "type: 'tool_call.%' is not an event type"),
        (
            ("--since", "2026-12-02T00:00:00Z", "--until", "2026-12-01T00:00:00Z"),
            "since must be before until",
        ),
    ],
)
def test_a_bad_filter_is_refused_with_why_and_prints_no_event(
    logged: tuple[Path, Store], args: tuple[str, ...], said: str
) -> None:
    config, _ = logged

    result = export(config, *args)

    assert result.exit_code == 2
    assert said in result.stderr
    assert result.stdout == ""


def test_follow_writes_what_commits_later_after_the_cursor_until_stopped(logged: tuple[Path, Store]) -> None:
    _, store = logged
    out = io.StringIO()
    stop = threading.Event()
    acme = EventFilter(tenant="acme")
    before = list(store.export(acme))
    followed: list[int] = []
    follower = threading.Thread(
        target=lambda: followed.append(follow(store, acme, 2, out, stop=stop, interval=0.05)), daemon=True
    )
    follower.start()
    try:
        eventually_sync(lambda: len(out.getvalue().splitlines()), lambda n: n == len(before) - 2)
        call(store, "globex", "carol", "tc-g2", run_id="run-g", capability="refund-order", hours=4)
        call(store, "acme", "bob", "tc-b2", run_id="run-b", capability="lookup-order", hours=5)

        written = eventually_sync(
            lambda: [json.loads(line) for line in out.getvalue().splitlines()],
            lambda got: any(e["tool_call_id"] == "tc-b2" and e["type"] == "tool_call.completed" for e in got),
        )
    finally:
        stop.set()
        follower.join(timeout=30)

    assert not follower.is_alive()
    assert [e["seq"] for e in written] == [e["seq"] for e in list(store.export(acme, after_seq=2))]
    assert {e["tenant"] for e in written} == {"acme"}
    assert followed == [written[-1]["seq"]]


def test_ocsf_lines_carry_a_class_per_type_and_the_whole_envelope(logged: tuple[Path, Store]) -> None:
    config, store = logged

    printed = lines(export(config, "--tenant", "acme", "--format", "ocsf"))

    envelopes = json.loads(json.dumps(list(store.export(EventFilter(tenant="acme"))), default=str))
    assert [e["unmapped"]["writ"] for e in printed] == envelopes
    assert {(e["class_uid"], e["category_uid"]) for e in printed} == {(6003, 6)}
    assert all(e["type_uid"] == 600399 and e["metadata"]["tenant_uid"] == "acme" for e in printed)
    failed = [e for e in printed if e["metadata"]["event_code"] == "tool_call.failed"]
    assert [(e["status_id"], e["api"]["service"]["name"]) for e in failed] == [(2, "refund-order")]
    first = printed[0]
    assert first["time"] == int(NOW.timestamp() * 1000)
    assert first["metadata"]["sequence"] == envelopes[0]["seq"]
