"""Telling whose a lookup's record is: the ids it mentions (the reader itself: test_lookups.py)."""

from __future__ import annotations

from capabilities.results import WRIT_DISPATCH_ID, mentions, names_another
from gateway.calls.actions import new_id


def test_a_value_mentions_an_id_only_as_a_whole_string_at_any_depth() -> None:
    record = {"refund": {"meta": [{"request_id": "req-1"}]}, "note": "not req-2 itself", "n": 3}

    assert mentions(record, ("req-1",))
    assert not mentions(record, ("req-2",))  # inside a longer string: not the id
    assert not mentions(record, ())
    assert not mentions(None, ("req-1",))


def test_a_writ_id_other_than_the_dispatchs_own_names_another_dispatch() -> None:
    # Writ's ids are `req_`/`tc_` and 28 hex digits; a backend's own ids of another form name none.
    ours, theirs = "req_" + "1" * 28, "req_" + "2" * 28

    assert names_another({"refund_id": "r1", "request_id": theirs}, (ours,))
    assert not names_another({"refund_id": "r2"}, (ours,))
    assert not names_another({"request_id": ours}, (ours,))
    assert not names_another({"request_id": "req-7", "note": "req_123"}, (ours,))


def test_writs_ids_are_of_the_form_a_lookup_tells_apart() -> None:
    assert WRIT_DISPATCH_ID.fullmatch(new_id("req")) and WRIT_DISPATCH_ID.fullmatch(new_id("tc"))
