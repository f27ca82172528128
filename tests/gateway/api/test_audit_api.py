"""GET /api/audit/events over the real gateway, in process (`gateway/mcp/inproc.py`), on both stores:
an auditor or admin pages through their own tenant's log once and never another's; an agent is refused;
another tenant or a bad parameter is refused with why. The filters themselves: `store/test_export.py`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest

from gateway.audit.ocsf import ocsf_event
from store import EventFilter
from tests.gateway.mcp.inproc import Writ, acme, writ
from tests.postgres import fresh_schema
from tests.store.builders import NOW
from tests.store.test_export import HOUR, several_tenants


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def gateway(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Writ]:
    """The gateway on a log of two tenants' calls (recorded through its own store)."""
    workdir = tmp_path_factory.mktemp("writ")
    with contextlib.ExitStack() as stack:
        if request.param == "sqlite":
            url = f"sqlite:///{workdir / 'writ.db'}"
        else:
            url = stack.enter_context(fresh_schema(request.getfixturevalue("postgres_url")))
        backend = stack.enter_context(acme(workdir))
        served = stack.enter_context(writ(workdir, backend, url, overrides={"workers": {"enabled": False}}))
        several_tenants(served.runtime.store)
        yield served


def get(gateway: Writ, token: str, **params: Any) -> httpx2.Response:
    headers = {"Authorization": f"Bearer {token}"}
    return httpx2.get(f"{gateway.url}/api/audit/events", params=params, headers=headers, timeout=10)


def test_an_auditor_pages_through_their_tenants_log_once(gateway: Writ) -> None:
    auditor = gateway.token("audrey", roles="auditor", tenant="acme")
    walked: list[dict[str, Any]] = []
    cursor = 0
    while True:
        page = get(gateway, auditor, after_seq=cursor, limit=3)
        assert page.status_code == 200, page.text
        body = page.json()
        assert len(body["events"]) <= 3
        walked.extend(body["events"])
        cursor = body["next_after_seq"]
        if not body["has_more"]:
            break

    expected = list(gateway.runtime.store.export(EventFilter(tenant="acme")))
    assert walked == expected
    assert len(expected) > 6
    assert cursor == expected[-1]["seq"]
    assert get(gateway, auditor, after_seq=cursor).json() == {
        "events": [],
        "next_after_seq": cursor,
        "has_more": False,
    }


def test_another_tenants_auditor_and_admin_see_only_their_own(gateway: Writ) -> None:
    globex = get(gateway, gateway.token("gail", roles="auditor", tenant="globex"), limit=1000).json()[
        "events"
    ]
    admin = get(gateway, gateway.token("ada", roles="admin", tenant="acme"), limit=1000).json()["events"]
    nobody = get(gateway, gateway.token("nina", roles="auditor", tenant="initech")).json()

    assert globex and {e["tenant"] for e in globex} == {"globex"}
    assert {e["tool_call_id"] for e in globex} - {None} == {"tc-g1"}
    assert admin and {e["tenant"] for e in admin} == {"acme"}
    assert nobody == {"events": [], "next_after_seq": 0, "has_more": False}


def test_the_filters_narrow_the_tenants_events(gateway: Writ) -> None:
    auditor = gateway.token("audrey", roles="auditor", tenant="acme")

    got = get(
        gateway,
        auditor,
        type=["tool_call.completed", "tool_call.failed"],
        principal="alice",
        capability="refund-order",
        since=NOW.isoformat(),
        until=(NOW + 4 * HOUR).isoformat(),
    )

    assert got.status_code == 200, got.text
    assert [(e["tool_call_id"], e["type"]) for e in got.json()["events"]] == [
        ("tc-a1", "tool_call.completed"),
        ("tc-a2", "tool_call.failed"),
    ]


def test_ocsf_pages_are_the_same_events_in_ocsf_by_the_same_cursor(gateway: Writ) -> None:
    auditor = gateway.token("audrey", roles="auditor", tenant="acme")
    walked: list[dict[str, Any]] = []
    cursor = 0
    while True:
        body = get(gateway, auditor, after_seq=cursor, limit=4, format="ocsf").json()
        walked.extend(body["events"])
        cursor = body["next_after_seq"]
        if not body["has_more"]:
            break

    expected = list(gateway.runtime.store.export(EventFilter(tenant="acme")))
    assert walked == [ocsf_event(e) for e in expected]
    assert [e["metadata"]["sequence"] for e in walked] == [e["seq"] for e in expected]
    assert {e["metadata"]["tenant_uid"] for e in walked} == {"acme"}
    assert all(e["class_uid"] == 6003 for e in walked if e["metadata"]["event_code"].startswith("tool_call."))


def test_ocsf_is_refused_to_an_agent_and_for_another_tenant(gateway: Writ) -> None:
    agent = get(gateway, gateway.token("alice", roles="agent", tenant="acme"), format="ocsf")
    elsewhere = get(
        gateway, gateway.token("audrey", roles="auditor", tenant="acme"), tenant="globex", format="ocsf"
    )

    assert (agent.status_code, agent.json()["error"]) == (403, "insufficient_role")
    assert (elsewhere.status_code, elsewhere.json()["error"]) == (403, "other_tenant")


def test_an_agent_is_refused_and_so_is_another_tenant(gateway: Writ) -> None:
    agent = get(gateway, gateway.token("alice", roles="agent", tenant="acme"))
    elsewhere = get(gateway, gateway.token("audrey", roles="auditor", tenant="acme"), tenant="globex")
    own = get(gateway, gateway.token("audrey", roles="auditor", tenant="acme"), tenant="acme")
    anonymous = httpx2.get(f"{gateway.url}/api/audit/events", timeout=10)

    assert (agent.status_code, agent.json()["error"]) == (403, "insufficient_role")
    assert (elsewhere.status_code, elsewhere.json()["error"]) == (403, "other_tenant")
    assert "globex" not in elsewhere.text.replace("tenant=globex", "")
    assert own.status_code == 200 and {e["tenant"] for e in own.json()["events"]} == {"acme"}
    assert anonymous.status_code == 401


@pytest.mark.parametrize(
    ("params", "said"),
    [
        ({"after_seq": "-1"}, "after_seq: '-1' is not a whole number"),
        ({"limit": "0"}, "limit: '0' is not a whole number from 1 to 1000"),
        ({"limit": "5000"}, "limit: '5000'"),
        ({"since": "last week"}, "since: 'last week' is not an ISO 8601 time"),
        ({"until": "2026-12-01T00:00:00"}, "needs an offset"),
        ({"type": "tool_call.%"}, "type: 'tool_call.%' is not an event type"),
        ({"types": "tool_call.*"}, "unknown parameter 'types'"),
        ({"after_seq": ["1", "2"]}, "after_seq: give it once"),
        ({"format": "cef"}, "format: 'cef' is not one of jsonl, ocsf"),
        ({"format": ["ocsf", "ocsf"]}, "format: give it once"),
    ],
)
def test_a_bad_parameter_is_a_400_saying_which(gateway: Writ, params: dict[str, Any], said: str) -> None:
    answer = get(gateway, gateway.token("audrey", roles="auditor", tenant="acme"), **params)

    assert answer.status_code == 400
    assert answer.json()["error"] == "invalid_request"
    assert said in answer.json()["error_description"]
