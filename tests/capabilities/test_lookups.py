"""Reading a lookup's answer (capabilities/lookups.py): every answer, for HTTP and MCP lookups alike,
gives the verdict the README promises, with and without `records:` and `outcome:` declared.

The answers of trial 5 (finding F1) were each read as the effect, settling calls `completed` /
`confirmed_success` with a lookup's envelope as their result, while the backend held no refund.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from capabilities.config import LookupReading, McpReconcile, RecordOutcome
from capabilities.contract import ToolResult
from capabilities.fake import fake_capability
from capabilities.lookups import FAILURE_FLAGS, FAILURE_WORDS, read_answer
from capabilities.mcp_reconcile import verdict
from capabilities.results import json_result, text_result
from tests.capabilities.conftest import invocation

REFUND = fake_capability("refund_order", reconcilable=True)
OURS_REQ, OURS_TC = "req_" + "1" * 28, "tc_" + "1" * 28
THEIRS_REQ = "req_" + "2" * 28
SENT = invocation(REFUND, idempotency_key="k-1", external_request_id=OURS_REQ, tool_call_id=OURS_TC)
LOOKUP = {"lookup": "/refunds?idempotency_key=k-1", "status_code": 200}

OURS = {"id": "re_1", "idempotency_key": "k-1", "amount": 10, "status": "succeeded"}
BY_REQUEST_ID = {"id": "re_2", "request_id": OURS_REQ, "status": "succeeded"}
THEIRS = {"id": "re_9", "idempotency_key": "k-1", "request_id": THEIRS_REQ, "status": "succeeded"}
UNNAMED = {"id": "re_3", "amount": 10, "status": "succeeded"}
FAILED = {"id": "re_x", "idempotency_key": "k-1", "status": "failed", "failure_reason": "expired_card"}

DEFAULT = LookupReading()
STATUS = RecordOutcome(field="/status", succeeded=["succeeded", "completed"], failed=["failed", "declined"])


def reading(records: str | None = None, outcome: RecordOutcome | None = None) -> LookupReading:
    return LookupReading(records=records, outcome=outcome)


def read(body: Any, how: LookupReading = DEFAULT) -> tuple[str, Any]:
    """The verdict, and the error (inconclusive), the record (succeeded) or the state (failed)."""
    found = read_answer(body, how, SENT, LOOKUP)
    if found.verdict == "succeeded":
        assert found.result is not None
        return found.verdict, found.result.structured
    if found.verdict == "failed":
        return found.verdict, found.evidence["state"]
    return found.verdict, found.evidence.get("error")


F1 = [
    # trial 5's answers: what each must give without a declaration, and with the one that fits it
    ({"refund": None}, ("not_found", None), reading("/refund"), ("not_found", None)),
    (
        {"refunds": [], "warnings": []},
        ("inconclusive", "unidentified_record"),
        reading("/refunds"),
        ("not_found", None),
    ),
    (
        {"data": [], "included": []},
        ("inconclusive", "unidentified_record"),
        reading("/data"),
        ("not_found", None),
    ),
    (
        {"error": "not_found", "message": "no refund with that key"},
        ("inconclusive", "lookup_error"),
        reading("/refunds"),
        ("inconclusive", "lookup_error"),
    ),
    (FAILED, ("inconclusive", "record_state_undeclared"), reading("", STATUS), ("failed", "failed")),
    (
        {"transfers": [], "count": 0},
        ("inconclusive", "unidentified_record"),
        reading("/transfers"),
        ("not_found", None),
    ),
]


@pytest.mark.parametrize(("body", "undeclared", "declaration", "declared"), F1)
def test_trial_5s_lookup_answers_are_never_read_as_the_effect(
    body: Any, undeclared: tuple[str, Any], declaration: LookupReading, declared: tuple[str, Any]
) -> None:
    assert read(body) == undeclared
    assert read(body, declaration) == declared


@pytest.mark.parametrize(("body", "undeclared", "declaration", "declared"), F1)
def test_an_mcp_lookup_tools_answer_is_read_as_an_http_lookups_is(
    body: Any, undeclared: tuple[str, Any], declaration: LookupReading, declared: tuple[str, Any]
) -> None:
    def said(setting: McpReconcile) -> tuple[str, Any]:
        found = verdict(json_result(body), setting, {"lookup_tool": "find"}, SENT)
        detail = found.evidence.get("error") if found.verdict == "inconclusive" else None
        return found.verdict, found.evidence.get("state") if found.verdict == "failed" else detail

    assert said(McpReconcile(tool="find")) == undeclared
    assert said(McpReconcile(tool="find", **declaration.model_dump())) == declared


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ([], ("not_found", None)),
        (None, ("not_found", None)),
        ([OURS], ("succeeded", OURS)),
        ([UNNAMED, OURS], ("succeeded", OURS)),
        ({"refunds": [OURS]}, ("succeeded", OURS)),  # an envelope of one member, opened once
        ({"refund": OURS}, ("succeeded", OURS)),
        ({"data": {"refund": OURS}}, ("succeeded", {"refund": OURS})),  # once only: the record holds it
        ({"refunds": []}, ("not_found", None)),
        ({"found": False}, ("not_found", None)),
        ({"found": False, "checked": "k-1"}, ("not_found", None)),
        ({"found": True, **OURS}, ("succeeded", OURS)),
        ({"found": True, "write": OURS}, ("succeeded", OURS)),
        ({"found": True, "write": None}, ("inconclusive", "unreadable_lookup")),
        ({"found": True}, ("inconclusive", "unidentified_record")),
        (OURS, ("succeeded", OURS)),
        ({"refunds": [OURS], "warnings": []}, ("succeeded", {"refunds": [OURS], "warnings": []})),
        ({"errors": [{"code": "timeout"}], "refunds": []}, ("inconclusive", "lookup_error")),
        ({"error": None, "refund": OURS}, ("succeeded", {"error": None, "refund": OURS})),
        ({}, ("inconclusive", "unidentified_record")),
        ("no such refund", ("inconclusive", "unreadable_lookup")),
        (3, ("inconclusive", "unreadable_lookup")),
        (["re_1"], ("inconclusive", "unreadable_lookup")),
    ],
)
def test_the_default_reading_of_an_answer(body: Any, expected: tuple[str, Any]) -> None:
    assert read(body) == expected


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"refunds": [OURS], "warnings": []}, ("succeeded", OURS)),
        ({"refunds": OURS, "count": 1}, ("succeeded", OURS)),
        ({"refunds": None}, ("not_found", None)),
        ({"refunds": [], "count": 0}, ("not_found", None)),
        ({"refunds": "none"}, ("inconclusive", "unreadable_lookup")),
        ({"refunds": [OURS, "re_2"]}, ("inconclusive", "unreadable_lookup")),
        ({"refunds": [], "error": "shard down"}, ("inconclusive", "lookup_error")),
    ],
)
def test_declared_records_are_read_where_the_pointer_says(body: Any, expected: tuple[str, Any]) -> None:
    assert read(body, reading("/refunds")) == expected


def test_an_answer_without_the_declared_records_says_which_pointer_was_missing() -> None:
    found = read_answer({"data": []}, reading("/data/0/refunds"), SENT, LOOKUP)

    assert found.verdict == "inconclusive"
    assert found.evidence["error"] == "unreadable_lookup"
    assert found.evidence["missing"] == "/data/0/refunds"
    assert found.evidence["lookup"] == LOOKUP["lookup"]


def test_pointers_reach_into_lists_and_escaped_names() -> None:
    body = {"data": [{"a/b": {"~x": [OURS]}}]}

    assert read(body, reading("/data/0/a~1b/~0x")) == ("succeeded", OURS)
    assert read(body, reading("/data/1/a~1b"))[1] == "unreadable_lookup"


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        ({**OURS, "status": "succeeded"}, ("succeeded", {**OURS, "status": "succeeded"})),
        ({**OURS, "status": "completed"}, ("succeeded", {**OURS, "status": "completed"})),
        ({**OURS, "status": "failed"}, ("failed", "failed")),
        ({**OURS, "status": "declined"}, ("failed", "declined")),
        ({**OURS, "status": "processing"}, ("inconclusive", "record_state_unknown")),
        ({**OURS, "status": "Failed"}, ("inconclusive", "record_state_unknown")),  # declared values exactly
        ({"id": "re_1", "idempotency_key": "k-1"}, ("inconclusive", "record_state_unknown")),
    ],
)
def test_a_declared_outcome_reads_the_records_state(
    record: dict[str, Any], expected: tuple[str, Any]
) -> None:
    assert read({"refunds": [record]}, reading("/refunds", STATUS)) == expected


def test_a_state_neither_succeeded_nor_failed_is_named_in_the_evidence() -> None:
    processing = read_answer([{**OURS, "status": "processing"}], reading(None, STATUS), SENT, LOOKUP)
    missing = read_answer([{"idempotency_key": "k-1"}], reading(None, STATUS), SENT, LOOKUP)

    assert processing.verdict == missing.verdict == "inconclusive"
    assert (processing.evidence["field"], processing.evidence["state"]) == ("/status", "processing")
    assert "processing" in processing.evidence["detail"]
    assert (missing.evidence["state"], missing.evidence["detail"]) == (None, "the record has no /status")


def test_a_failed_record_is_the_failed_verdict_with_the_record_in_its_evidence() -> None:
    found = read_answer({"refunds": [FAILED]}, reading("/refunds", STATUS), SENT, LOOKUP)

    assert found.verdict == "failed" and found.result is None
    assert found.evidence == {**LOOKUP, "records": 1, "field": "/status", "state": "failed", "record": FAILED}


def test_declared_values_keep_their_json_type() -> None:
    flags = reading(None, RecordOutcome(field="/ok", succeeded=[True], failed=[False]))

    assert read([{"ok": True, "key": "k-1"}], flags)[0] == "succeeded"
    assert read([{"ok": False, "key": "k-1"}], flags) == ("failed", False)
    assert read([{"ok": 1, "key": "k-1"}], flags) == ("inconclusive", "record_state_unknown")
    assert read([{"ok": 0, "key": "k-1"}], flags) == ("inconclusive", "record_state_unknown")


def test_of_this_calls_records_one_that_succeeded_wins_over_a_failed_try() -> None:
    tries = [{**FAILED, "request_id": OURS_REQ}, {**OURS, "request_id": OURS_REQ}]

    assert read(tries, reading(None, STATUS)) == ("succeeded", tries[1])
    assert read(list(reversed(tries)), reading(None, STATUS)) == ("succeeded", tries[1])
    unsure = [{**FAILED, "request_id": OURS_REQ}, {**OURS, "request_id": OURS_REQ, "status": "processing"}]
    assert read(unsure, reading(None, STATUS)) == ("inconclusive", "record_state_unknown")


@pytest.mark.parametrize("word", sorted(FAILURE_WORDS))
@pytest.mark.parametrize("field", ["status", "state"])
def test_an_undeclared_state_that_reads_like_a_failure_is_not_success(field: str, word: str) -> None:
    for shown in (word, word.upper()):
        found = read_answer([{"idempotency_key": "k-1", field: shown}], DEFAULT, SENT, LOOKUP)

        assert found.verdict == "inconclusive"  # never a failure from a guess, either
        assert found.evidence["error"] == "record_state_undeclared"
        assert (found.evidence["field"], found.evidence["state"]) == (f"/{field}", shown)
        assert "declare" in found.evidence["detail"] and "outcome" in found.evidence["detail"]


@pytest.mark.parametrize("flag", FAILURE_FLAGS)
def test_an_undeclared_success_flag_that_is_false_is_not_success(flag: str) -> None:
    found = read_answer([{"idempotency_key": "k-1", flag: False}], DEFAULT, SENT, LOOKUP)
    nested = read_answer([{"idempotency_key": "k-1", "result": {flag: False}}], DEFAULT, SENT, LOOKUP)

    assert (found.verdict, found.evidence["error"]) == ("inconclusive", "record_state_undeclared")
    assert (found.evidence["field"], found.evidence["state"]) == (f"/{flag}", False)
    assert f"/{flag} is false" in found.evidence["detail"]
    assert (nested.verdict, nested.evidence["field"]) == ("inconclusive", f"/result/{flag}")
    assert read([{**OURS, flag: True}])[0] == "succeeded"
    assert read([{**OURS, flag: 0}])[0] == "succeeded"  # JSON false only, as a declared value would be


def test_an_undeclared_state_of_another_word_is_success() -> None:
    assert read([{**OURS, "status": "pending_settlement"}]) == (
        "succeeded",
        {**OURS, "status": "pending_settlement"},
    )
    assert read([{**OURS, "status": {"code": "failed"}}])[0] == "succeeded"  # not a top-level string


def test_a_record_is_this_calls_only_when_it_names_the_call() -> None:
    nested_call_id = {"id": "re_4", "meta": {"writ": [OURS_TC]}}

    assert read([BY_REQUEST_ID]) == ("succeeded", BY_REQUEST_ID)
    assert read([nested_call_id]) == ("succeeded", nested_call_id)
    assert read([OURS]) == ("succeeded", OURS)  # the key as sent to the backend
    assert read([{**OURS, "idempotency_key": "k-1-and-more"}]) == ("inconclusive", "unidentified_record")
    assert read([UNNAMED]) == ("inconclusive", "unidentified_record")


def test_an_unidentified_record_tells_the_operator_what_to_echo() -> None:
    found = read_answer([UNNAMED], DEFAULT, SENT, LOOKUP)

    assert found.verdict == "inconclusive"
    assert "X-Request-Id" in found.evidence["detail"] and "idempotency key" in found.evidence["detail"]


def test_records_naming_other_dispatches_of_writs_are_nothing_found() -> None:
    found = read_answer([THEIRS], DEFAULT, SENT, LOOKUP)

    assert found.verdict == "not_found"  # though it has this call's key: a later call's, or another's
    assert found.evidence["records_of_others"] == 1
    # Beside one naming nothing, that one may be this call's: not nothing found.
    assert read([THEIRS, UNNAMED]) == ("inconclusive", "unidentified_record")
    assert read([THEIRS, OURS]) == ("succeeded", OURS)
    assert read([THEIRS, BY_REQUEST_ID]) == ("succeeded", BY_REQUEST_ID)


def test_of_several_records_the_one_naming_the_dispatch_is_its_own() -> None:
    resend = {"refund_id": "r1", "request_id": "req_" + "5" * 28, "idempotency_key": "k-1"}
    late = {"refund_id": "r2", "request_id": OURS_REQ, "idempotency_key": "k-1"}

    found = read_answer({"refunds": [resend, late]}, reading("/refunds"), SENT, LOOKUP)

    assert (found.verdict, found.evidence["records"]) == ("succeeded", 2)
    assert found.result is not None and found.result.structured == late


def test_an_mcp_lookup_tool_error_or_an_answer_without_json_says_nothing() -> None:
    setting = McpReconcile(tool="find")

    def said(result: ToolResult) -> tuple[str, Any]:
        found = verdict(result, setting, {"lookup_tool": "find"}, SENT)
        return found.verdict, found.evidence.get("error")

    assert said(text_result("[]", is_error=True)) == ("inconclusive", "lookup_tool_error")
    assert said(text_result("no transfer")) == ("inconclusive", "unreadable_lookup")
    assert said(ToolResult()) == ("inconclusive", "unreadable_lookup")
    assert said(text_result("[]")) == ("not_found", None)  # no structured content: the text's JSON
    assert said(text_result('{"transfers": [], "count": 0}')) == ("inconclusive", "unidentified_record")


def answer_nesting(levels: int) -> Any:
    """An answer holding this call's record, with a value `levels` deep in it: what Python's parser
    makes of such JSON (as an MCP lookup's structured content may hold it)."""
    inner = '{"a":' * levels + "1" + "}" * levels
    return json.loads('{"refunds": [{"idempotency_key": "k-1", "status": "succeeded", "x": ' + inner + "}]}")


@pytest.mark.parametrize("how", [DEFAULT, reading("/refunds", STATUS)])
def test_an_answer_nested_too_deep_to_read_is_inconclusive_not_a_crash(how: LookupReading) -> None:
    # Reading it recursively, a frame or two per level, crashed with RecursionError: every reconciler
    # pass failed on it, the call was never escalated and the calls due after it were never looked up.
    assert read(answer_nesting(600), how) == ("inconclusive", "unreadable_lookup")
    # As deep as answers go, a record is read as ever.
    assert read(answer_nesting(50), how)[0] == "succeeded"


def test_a_record_naming_this_call_and_another_dispatch_is_not_taken_for_this_calls_effect() -> None:
    # A lookup listing an order's refunds: another call's refund, whose metadata an agent filled with
    # the id of its earlier, unanswered call (as Stripe keeps a refund's `metadata`), names both. Taken
    # for this call's own, it settled the unanswered refund `completed` with the other call's refund
    # (trial 6, K4).
    retry = {"id": "re_5", "request_id": THEIRS_REQ, "metadata": {"retry_of": OURS_TC}, "status": "succeeded"}

    assert read({"refunds": [retry]}, reading("/refunds", STATUS)) == ("inconclusive", "ambiguous_record")
    assert read([retry]) == ("inconclusive", "ambiguous_record")
    # Beside a record that is this call's alone, that one is read.
    assert read([retry, BY_REQUEST_ID]) == ("succeeded", BY_REQUEST_ID)
    assert read([retry, OURS]) == ("succeeded", OURS)
