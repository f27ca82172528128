"""Reading a lookup's answer: what the backend says about an earlier dispatch.

One reader for every executor that looks an outcome up (an HTTP capability's `reconcile:` request,
an upstream MCP lookup tool); the executors keep only what their transport says (an HTTP 404 is
`not_found`; another non-2xx, an MCP tool error or an answer that is not JSON is `inconclusive`).

The answer is read in three steps, each of which may stop at `not_found` or `inconclusive`:
1. Where the records are: at the lookup's `records:` pointer, or by the default reading (`_located`).
2. Which record is this dispatch's: one naming its external request id or tool call id, else one
   naming its idempotency key as sent and no other dispatch of Writ's. A lookup by key also finds
   other principals' and later calls' records, so a record naming none of the call's ids and keys is
   no evidence of this call's effect (`unidentified_record`); records that all name other
   dispatches of Writ's are none of this call's (`records_of_others`: nothing found), and one naming
   this call and another dispatch is no more this call's than the other's (`ambiguous_record`).
3. What the record says: by the lookup's `outcome:` declaration, or, without one, `succeeded` unless
   a `status` or `state` in it reads like a failure (`FAILURE_WORDS`), or a flag such as `success` is
   false (`FAILURE_FLAGS`): then `inconclusive`. A failure
   is never guessed: only a declared `failed` value makes the `failed` verdict.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from capabilities.config import LookupReading, same_state
from capabilities.contract import Invocation, ReconcileResult
from capabilities.pointers import ABSENT, escape_token, resolve
from capabilities.results import compact_json, deeper_than, json_result, mentions, names_another

FAILURE_WORDS = frozenset(
    {"failed", "failure", "error", "declined", "rejected", "canceled", "cancelled", "reversed", "voided"}
)
"""Words a `status` or `state` may hold when the effect failed: a record holding one, at any depth,
is not read as a success unless the lookup declares its `outcome:`."""

FAILURE_FLAGS = ("success", "succeeded", "successful", "ok")
"""Members whose `false` says the effect did not succeed: read as a failure word is."""

_SHOWN_CHARS = 300

MAX_DEPTH = 64
"""The deepest nesting of arrays and objects a lookup answer is read at. Reading is recursive (a frame
or two per level), and Python's parser takes JSON several hundred levels deep: an answer nested deeper
is inconclusive rather than a RecursionError that fails every pass of the reconciler. (An HTTP answer
that deep is not JSON to `parse_json` already; an MCP lookup's structured content is read here.)"""

Records = list[Mapping[str, Any]]


def read_answer(
    body: Any, reading: LookupReading, invocation: Invocation, evidence: Mapping[str, Any]
) -> ReconcileResult:
    """The verdict of a lookup that answered the JSON `body`, about the dispatch `invocation`."""
    evidence = dict(evidence)
    if deeper_than(body, MAX_DEPTH):
        detail = f"the answer nests arrays and objects deeper than {MAX_DEPTH} levels"
        return _inconclusive(evidence, "unreadable_lookup", detail)
    records = _located(body, reading, evidence)
    if isinstance(records, ReconcileResult):
        return records
    evidence["records"] = len(records)
    if not records:
        return ReconcileResult("not_found", evidence=evidence)
    ids = (invocation.external_request_id, invocation.tool_call_id)
    naming = [record for record in records if mentions(record, ids)]
    own = [record for record in naming if not names_another(record, ids)]
    keyed = [
        record
        for record in records
        if mentions(record, (invocation.idempotency_key,)) and not names_another(record, ids)
    ]
    if own or keyed:
        return _judged(own or keyed, reading, evidence)
    if naming:
        # Another dispatch's record that mentions this call (metadata holding its id, `retry_of`),
        # or this call's holding another's: which effect it is cannot be told.
        return _inconclusive(
            evidence,
            "ambiguous_record",
            "a record names this call and another dispatch of Writ's: it may be the other's effect",
        )
    if all(names_another(record, ids) for record in records):
        return ReconcileResult("not_found", evidence={**evidence, "records_of_others": len(records)})
    return _inconclusive(
        evidence,
        "unidentified_record",
        "no record names this call (its X-Request-Id or _meta writ/requestId, its tool call id, or its "
        "idempotency key): the backend's records must echo one of them",
    )


def _located(body: Any, reading: LookupReading, evidence: Mapping[str, Any]) -> Records | ReconcileResult:
    """The records in the answer `body`, or the verdict when it holds none to read.

    An object with an `error` or `errors` member (not empty) says the lookup failed, unless the
    declared `records:` is the whole answer (`""`: the answer is the record, its `error` a field).
    At a declared `records:` pointer: nothing there is unreadable; null or `[]` is none; an object is
    one record and a list of objects the records. Without one, the default reading: a list is the
    records; `{"found": false}` is none and `{"found": true, ...}` the rest; an object with one member
    holding null, a list or an object is an envelope, opened once; any other object is one record.
    """
    if reading.records == "":
        return _as_records(body, evidence, "")
    error = _error(body, evidence)
    if error is not None:
        return error
    if reading.records is not None:
        found = resolve(body, reading.records)
        if found is ABSENT:
            detail = f"the answer has nothing at {reading.records}"
            return _inconclusive(evidence, "unreadable_lookup", detail, missing=reading.records)
        return _as_records(found, evidence, reading.records)
    if not isinstance(body, Mapping):
        return _as_records(body, evidence, "")
    if isinstance(body.get("found"), bool):
        if not body["found"]:
            return ReconcileResult("not_found", evidence={**evidence, "found": False, "records": 0})
        records = _as_records(_opened({k: v for k, v in body.items() if k != "found"}), evidence, "")
        if isinstance(records, list) and not records:
            return _inconclusive(evidence, "unreadable_lookup", "found: true beside no record")
        return records
    return _as_records(_opened(body), evidence, "")


def _error(body: Any, evidence: Mapping[str, Any]) -> ReconcileResult | None:
    """`lookup_error` when the answer, records beside, has an `error` or `errors` member that is not
    empty: whatever else it holds, the lookup did not work as asked."""
    if not isinstance(body, Mapping):
        return None
    for name in ("error", "errors"):
        if body.get(name) not in (None, [], {}, "", False):
            said = {**evidence, "backend_error": compact_json(body[name])[:_SHOWN_CHARS]}
            return _inconclusive(
                said, "lookup_error", f"the lookup answered with {name!r}, so nothing it says counts"
            )
    return None


def _opened(body: Mapping[str, Any]) -> Any:
    """An envelope's only value (`{"refunds": [...]}`, `{"refund": null}`), else the object itself."""
    if len(body) == 1:
        (value,) = body.values()
        if value is None or isinstance(value, list | Mapping):
            return value
    return body


def _as_records(found: Any, evidence: Mapping[str, Any], where: str) -> Records | ReconcileResult:
    if found is None:
        return []
    if isinstance(found, Mapping):
        return [found]
    if isinstance(found, list) and all(isinstance(record, Mapping) for record in found):
        return list(found)
    shown = f"at {where}" if where else "the answer"
    return _inconclusive(
        evidence, "unreadable_lookup", f"{shown} is {_kind(found)}, neither a record nor a list of them"
    )


def _kind(value: Any) -> str:
    if isinstance(value, list):
        return "a list holding something other than objects"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    return "a number" if isinstance(value, int | float) else "no record"


def _judged(
    candidates: Sequence[Mapping[str, Any]], reading: LookupReading, evidence: dict[str, Any]
) -> ReconcileResult:
    """The verdict of this call's records: one that succeeded wins (a backend may record a failed try
    before the one that took effect), then one whose state tells nothing yet; all failed is `failed`."""
    states = [(_state(record, reading), record) for record in candidates]
    for (verdict, _), record in states:
        if verdict == "succeeded":
            return ReconcileResult("succeeded", json_result(dict(record)), evidence)
    for (verdict, said), _ in states:
        if verdict == "inconclusive":
            return ReconcileResult("inconclusive", evidence={**evidence, **said})
    (_, said), record = states[0]
    return ReconcileResult("failed", evidence={**evidence, **said, "record": dict(record)})


def _state(record: Mapping[str, Any], reading: LookupReading) -> tuple[str, dict[str, Any]]:
    """What one record says of its effect: `succeeded`, `failed` or `inconclusive`, with why."""
    outcome = reading.outcome
    if outcome is not None:
        value = resolve(record, outcome.field)
        said = {"field": outcome.field, "state": None if value is ABSENT else value}
        if value is not ABSENT and any(same_state(value, listed) for listed in outcome.succeeded):
            return "succeeded", said
        if value is not ABSENT and any(same_state(value, listed) for listed in outcome.failed):
            return "failed", said
        detail = (
            f"the record has no {outcome.field}"
            if value is ABSENT
            else f"{outcome.field} is {compact_json(value)[:_SHOWN_CHARS]}, neither succeeded nor failed"
        )
        return "inconclusive", {**said, "error": "record_state_unknown", "detail": detail}
    failure = _failure_word(record, "")
    if failure is not None:
        where, value = failure
        return "inconclusive", {
            "error": "record_state_undeclared",
            "field": where,
            "state": value,
            "detail": f"the record's {where} is {compact_json(value)}, which may mean the effect failed; "
            "declare the "
            "lookup's outcome: {field, succeeded, failed} to read it",
        }
    return "succeeded", {}


def _failure_word(value: Any, where: str) -> tuple[str, Any] | None:
    """Where in `value` a `status` or `state` member reads like a failure, or a `success`-like flag is
    false, and what it says; at any depth, as an envelope taken for one record holds its records inside."""
    if isinstance(value, Mapping):
        for name in ("status", "state"):
            said = value.get(name)
            if isinstance(said, str) and said.strip().lower() in FAILURE_WORDS:
                return f"{where}/{name}", said
        for name in FAILURE_FLAGS:
            if value.get(name) is False:
                return f"{where}/{name}", False
        items: Any = ((escape_token(str(name)), item) for name, item in value.items())
    elif isinstance(value, list):
        items = ((str(index), item) for index, item in enumerate(value))
    else:
        return None
    for name, item in items:
        found = _failure_word(item, f"{where}/{name}")
        if found is not None:
            return found
    return None


def _inconclusive(
    evidence: Mapping[str, Any], error: str, detail: str, missing: str | None = None
) -> ReconcileResult:
    said = {**evidence, "error": error, "detail": detail}
    if missing is not None:
        said["missing"] = missing
    return ReconcileResult("inconclusive", evidence=said)
