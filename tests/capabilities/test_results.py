"""Reading a lookup's records: which one is the dispatch's own, when a key holds several effects."""

from __future__ import annotations

from capabilities.fake import fake_capability
from capabilities.mcp_reconcile import verdict
from capabilities.results import (
    WRIT_DISPATCH_ID,
    json_result,
    lookup_found,
    mentions,
    names_another,
    record_of,
)
from gateway.calls.actions import new_id
from tests.capabilities.conftest import invocation

REFUND = fake_capability("refund_order", reconcilable=True)


def test_a_value_mentions_an_id_only_as_a_whole_string_at_any_depth() -> None:
    record = {"refund": {"meta": [{"request_id": "req-1"}]}, "note": "not req-2 itself", "n": 3}

    assert mentions(record, ("req-1",))
    assert not mentions(record, ("req-2",))  # inside a longer string: not the id
    assert not mentions(record, ())
    assert not mentions(None, ("req-1",))


def test_of_several_records_under_one_key_the_one_naming_the_dispatch_is_its_own() -> None:
    sent = invocation(REFUND, idempotency_key="k", external_request_id="req-late", tool_call_id="tc-late")
    resend = {"refund_id": "r1", "request_id": "req-resend"}
    late = {"refund_id": "r2", "request_id": "req-late"}
    by_call_id = {"refund_id": "r3", "writ_tool_call_id": "tc-late"}

    assert record_of([resend, late], sent) == late  # the re-send landed first, this one later
    assert record_of([resend, by_call_id], sent) == by_call_id
    # Records that name no dispatch: the first, as before.
    assert record_of([{"refund_id": "r1"}, {"refund_id": "r2"}], sent) == {"refund_id": "r1"}


def test_an_mcp_lookup_answers_with_the_dispatchs_own_record_and_counts_them_all() -> None:
    sent = invocation(REFUND, external_request_id="req-late")
    records = [{"id": 1, "request_id": "req-resend"}, {"id": 2, "request_id": "req-late"}]

    found = verdict(json_result({"writes": records}), {"lookup_tool": "find_writes"}, sent)

    assert (found.verdict, found.evidence["records"]) == ("succeeded", 2)
    assert found.result is not None and found.result.structured == {"id": 2, "request_id": "req-late"}


def test_of_records_naming_other_dispatches_of_writs_one_naming_none_is_chosen() -> None:
    # Another principal's refund under the same key: keys are each principal's own at Writ, not at
    # the backend. Writ's ids are `req_`/`tc_` and 28 hex digits. Whether the record chosen is this
    # dispatch's effect at all the reconciler decides (gateway/calls/test_reconcile.py).
    ours, theirs = "req_" + "1" * 28, "req_" + "2" * 28
    sent = invocation(REFUND, idempotency_key="k", external_request_id=ours, tool_call_id="tc_" + "3" * 28)
    their_refund = {"refund_id": "r1", "request_id": theirs}
    unnamed = {"refund_id": "r2"}

    assert names_another(their_refund, (ours,)) and not names_another(unnamed, (ours,))
    assert not names_another({"request_id": ours}, (ours,))
    assert record_of([their_refund, unnamed], sent) == unnamed  # names no one: may be this one's
    assert record_of([their_refund, {"request_id": ours}], sent) == {"request_id": ours}
    assert record_of([their_refund], sent) == their_refund
    not_writs = {"request_id": "req-7", "note": "req_123"}  # a backend's own ids: they name no dispatch
    assert not names_another(not_writs, (ours,))

    found = lookup_found([their_refund, unnamed], sent, {"lookup": "GET /refunds"})
    assert (found.verdict, found.evidence) == ("succeeded", {"lookup": "GET /refunds", "records": 2})
    assert found.result is not None and found.result.structured == unnamed
    # An MCP lookup tool's answer is read the same way.
    answer = verdict(json_result({"writes": [their_refund, unnamed]}), {}, sent)
    assert answer.result is not None and answer.result.structured == unnamed


def test_writs_ids_are_of_the_form_a_lookup_tells_apart() -> None:
    assert WRIT_DISPATCH_ID.fullmatch(new_id("req")) and WRIT_DISPATCH_ID.fullmatch(new_id("tc"))
