"""`security.*` events: appended on the chain beside the calls, verified clean (chain, grammar and the
replay of the projections), rebuilt without changing a projection, and carried by the export."""

from __future__ import annotations

from datetime import timedelta

import pytest

from store import EventFilter, Store
from store.events import SecurityNoted, parse_event
from store.security import SecurityNote
from tests.store.builders import NOW
from tests.store.test_export import several_tenants


def note(**given: object) -> SecurityNote:
    fields: dict[str, object] = {
        "type": "security.auth_failed",
        "kind": "expired",
        "count": 1,
        "first_at": NOW,
        "last_at": NOW,
        "window_s": 60.0,
        "source": "203.0.113.9",
    }
    fields.update(given)
    return SecurityNote(**fields)  # type: ignore[arg-type]


def test_security_events_are_appended_on_the_chain_and_verify_clean(store: Store) -> None:
    several_tenants(store)
    written = store.record_security(
        [
            note(count=412, last_at=NOW + timedelta(seconds=59), issuer="https://idp", subject="mallory"),
            note(
                type="security.unknown_tool", kind="unknown_tool", source=None, tenant="acme", tool_name="rm"
            ),
            note(type="security.edge_refused", kind="request_too_large", path="/api/approvals"),
        ]
    )
    several_tenants_after = list(store.export())

    assert [e.type for e in written] == [
        "security.auth_failed",
        "security.unknown_tool",
        "security.edge_refused",
    ]
    assert [e.seq for e in written] == [e["seq"] for e in several_tenants_after[-3:]]
    report = store.verify()
    assert report.ok, report
    assert report.replayed and report.projections_compared
    assert report.grammar_violation is None


def test_the_export_carries_them_with_their_count_and_nothing_else(store: Store) -> None:
    store.record_security([note(count=7, last_at=NOW + timedelta(seconds=30))])

    (event,) = store.export(EventFilter(types=("security.*",)))

    assert event["tenant"] is None and event["tool_call_id"] is None and event["run_id"] is None
    payload = SecurityNoted.model_validate(event["payload"])
    assert (payload.kind, payload.count, payload.source) == ("expired", 7, "203.0.113.9")
    assert payload.first_at < payload.last_at
    assert parse_event(event).type == "security.auth_failed"


def test_a_tenants_security_events_are_exported_with_that_tenant_only(store: Store) -> None:
    store.record_security(
        [
            note(type="security.unknown_tool", kind="unknown_tool", tenant="acme", tool_name="drop_db"),
            note(type="security.unknown_tool", kind="unknown_tool", tenant="globex", tool_name="x"),
        ]
    )

    acme = list(store.export(EventFilter(tenant="acme")))

    assert [e["payload"]["tool_name"] for e in acme] == ["drop_db"]


def test_a_rebuild_replays_them_and_changes_no_projection(store: Store) -> None:
    several_tenants(store)
    store.record_security([note(), note(kind="bad_signature")])
    calls = store.list_calls(limit=100)

    assert store.rebuild() == len(list(store.export()))
    assert store.list_calls(limit=100) == calls
    assert store.verify().ok


def test_no_note_writes_nothing(store: Store) -> None:
    assert store.record_security([]) == []
    assert list(store.export()) == []


@pytest.mark.parametrize("naive", [NOW.replace(tzinfo=None)])
def test_a_note_without_a_timezone_is_refused(store: Store, naive: object) -> None:
    with pytest.raises(ValueError):
        store.record_security([note(last_at=naive)])
    assert list(store.export()) == []


def test_a_refusal_at_the_authorization_server_keeps_its_client_and_redirect_host(store: Store) -> None:
    store.record_security(
        [
            note(
                type="security.oauth_refused",
                kind="redirect_mismatch",
                tenant="acme",
                client_id="https://client.example/meta.json",
                redirect_host="evil.example",
            )
        ]
    )

    (event,) = store.export(EventFilter(types=("security.oauth_refused",), tenant="acme"))

    payload = SecurityNoted.model_validate(event["payload"])
    assert (payload.kind, payload.client_id, payload.redirect_host) == (
        "redirect_mismatch",
        "https://client.example/meta.json",
        "evil.example",
    )
    assert parse_event(event).type == "security.oauth_refused"
    report = store.verify()
    assert report.ok and report.grammar_violation is None, report
