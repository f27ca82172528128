"""What a refusal keeps of the arguments it refused: bounded, whatever the client sent."""

from __future__ import annotations

import hashlib
import json

from store import Store
from store.refusals import PREVIEW_CHARS, REFUSED_ARGUMENTS
from tests.store.builders import refusal_request


def test_a_refusal_of_megabytes_of_arguments_records_a_digest_and_a_bounded_preview(store: Store) -> None:
    # One client grew the store by 210 MB in 4.5 s: every schema-invalid call kept its arguments whole.
    huge = {"order": "x" * 4_000_000, "note": "ü" * 1000}
    call = store.refuse(
        refusal_request(tool_call_id="tc-huge", arguments=huge, summary="s" * 100_000, detail="d" * 100_000)
    )

    text = json.dumps(huge, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    kept = call.arguments[REFUSED_ARGUMENTS]
    assert kept["sha256"] == hashlib.sha256(text.encode()).hexdigest()
    assert kept["bytes"] == len(text.encode()) and kept["preview"] == text[:PREVIEW_CHARS]
    assert call.arguments.keys() == {REFUSED_ARGUMENTS}
    assert len(call.error or "") <= 3200
    for event in store.events(tool_call_id="tc-huge"):
        assert len(json.dumps(event.payload, ensure_ascii=False)) < 8_000, event.type
    assert store.verify().ok


def test_a_refusal_of_small_arguments_keeps_them_as_they_are(store: Store) -> None:
    call = store.refuse(refusal_request(tool_call_id="tc-small", arguments={"order": "not-a-number"}))

    assert call.arguments == {"order": "not-a-number"}
