"""Reading calls, events and approvals, and keeping tenants apart."""

from __future__ import annotations

from datetime import timedelta

from store import Store
from tests.store.builders import NOW, REQUIRE_APPROVAL, call_request


def seed_two_tenants(store: Store) -> None:
    store.admit(call_request(tool_call_id="acme-1", run_id="run-a", idempotency_key="k1"))
    store.admit(
        call_request(
            tool_call_id="acme-2", run_id="run-a", idempotency_key="k2", now=NOW + timedelta(seconds=1)
        )
    )
    store.admit(
        call_request(
            tool_call_id="globex-1",
            tenant="globex",
            run_id="run-g",
            idempotency_key="k1",
            decision=REQUIRE_APPROVAL,
        )
    )


def test_get_call_with_a_tenant_hides_other_tenants_calls(store: Store) -> None:
    seed_two_tenants(store)

    assert store.get_call("globex-1", tenant="acme") is None
    found = store.get_call("globex-1", tenant="globex")
    assert found is not None and found.tenant == "globex"
    assert store.get_call("globex-1") is not None


def test_events_filter_by_tenant_run_and_call(store: Store) -> None:
    seed_two_tenants(store)

    assert {e.tenant for e in store.events(tenant="globex")} == {"globex"}
    assert {e.tool_call_id for e in store.events(tenant="acme") if e.tool_call_id} == {"acme-1", "acme-2"}
    assert {e.run_id for e in store.events(run_id="run-a")} == {"run-a"}
    assert {e.tool_call_id for e in store.events(tool_call_id="acme-2")} == {"acme-2"}


def test_events_page_after_a_seq_with_a_limit(store: Store) -> None:
    seed_two_tenants(store)
    every = store.events()

    page = store.events(after_seq=2, limit=3)

    assert [e.seq for e in every] == list(range(1, len(every) + 1))
    assert [e.seq for e in page] == [3, 4, 5]


def test_list_calls_filters_by_tenant_and_status_newest_first(store: Store) -> None:
    seed_two_tenants(store)

    assert [c.tool_call_id for c in store.list_calls(tenant="acme")] == ["acme-2", "acme-1"]
    assert [c.tool_call_id for c in store.list_calls(status="approval_pending")] == ["globex-1"]
    assert store.list_calls(tenant="acme", status="approval_pending") == []
    assert len(store.list_calls(limit=1)) == 1


def test_approvals_are_filtered_by_tenant(store: Store) -> None:
    seed_two_tenants(store)
    approval_id = store.list_approvals()[0].approval_id

    assert store.list_approvals(tenant="acme") == []
    assert store.get_approval(approval_id, tenant="acme") is None
    approval = store.get_approval(approval_id, tenant="globex")
    assert approval is not None and approval.tool_call_id == "globex-1"


def test_run_call_count_is_per_tenant(store: Store) -> None:
    seed_two_tenants(store)

    assert store.run_call_count("run-a", "acme") == 2
    assert store.run_call_count("run-a", "globex") == 0
    assert store.run_call_count("run-unknown", "acme") == 0


def test_export_yields_every_envelope_in_seq_order(store: Store) -> None:
    seed_two_tenants(store)

    exported = list(store.export())

    assert [e["seq"] for e in exported] == [e.seq for e in store.events()]
    assert set(exported[0]) == {
        "event_id", "seq", "type", "schema_version", "occurred_at", "producer", "run_id", "tool_call_id",
        "approval_id", "capability_id", "capability_version", "policy_version", "correlation_id",
        "causation_id", "tenant", "payload", "prev_hash", "hash",
    }  # fmt: skip
    assert exported[0]["occurred_at"] == "2026-11-30T12:00:00.123456Z"


def test_a_lookup_by_text_no_row_can_hold_finds_nothing_on_both_databases(store: Store) -> None:
    # PostgreSQL's text cannot hold NUL: asking raised a DataError (a 500 at /api/calls/tc_%00, at
    # writ_call_status, ...) where SQLite found nothing; a lone surrogate could not be encoded for either.
    seed_two_tenants(store)
    for odd in ("acme-1\x00", "\x00", "acme-\ud800"):
        assert store.get_call(odd) is None
        assert store.get_call("acme-1", tenant=odd) is None
        assert store.find_call_by_key("acme", "alice", odd) is None
        assert store.run_call_count(odd, "acme") == 0
        assert store.list_calls(tenant="acme", status=odd) == []
        assert store.events(run_id=odd) == [] and store.events(tool_call_id=odd) == []
        assert store.get_approval(odd) is None
        assert store.list_approvals(tenant=odd) == [] and store.list_approvals(status=odd) == []
        assert store.is_revoked("acme", odd) is False
    assert store.get_call("acme-1") is not None
