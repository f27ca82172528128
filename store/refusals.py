"""What the log keeps of a refused call: enough to say what was refused, never an unbounded copy.

A refusal is recorded for every identified call that is turned away, including calls whose arguments
fail the schema, and the log is permanent and hash-chained: a client that sends megabytes of invalid
arguments in a loop would otherwise grow it without bound (210 MB in 4.5 s, issue 17). Arguments
larger than the preview bound are kept as their digest, their size and a preview; the summary and the
refusal's detail are clipped.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from store.model import RefusalRequest

PREVIEW_CHARS = 1024
"""Arguments whose JSON text fits are kept as they are; larger ones keep this much of it."""
SUMMARY_CHARS = 300
DETAIL_CHARS = 3200
"""Room for the ten clipped schema errors a refusal for invalid arguments carries (gateway/validation)."""
REFUSED_ARGUMENTS = "writ/refusedArguments"
"""The key under which a refusal keeps the digest and preview of arguments too large to keep."""


def bounded(req: RefusalRequest) -> RefusalRequest:
    """`req` with its arguments, summary and detail cut to what a refusal may record."""
    return dataclasses.replace(
        req,
        identity=dataclasses.replace(req.identity, arguments=bounded_arguments(req.identity.arguments)),
        summary=_clip(req.summary, SUMMARY_CHARS),
        detail=_clip(req.detail, DETAIL_CHARS),
    )


def bounded_arguments(arguments: Mapping[str, Any]) -> Mapping[str, Any]:
    """`arguments` unchanged if their JSON fits the preview, else their SHA-256, size and a preview."""
    text = json.dumps(dict(arguments), sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    if len(text) <= PREVIEW_CHARS:
        return arguments
    raw = text.encode("utf-8", "backslashreplace")
    return {
        REFUSED_ARGUMENTS: {
            # Of the arguments as the log would have kept them (redacted fields already hashed), so the
            # digest reveals nothing the full record would not have.
            "sha256": hashlib.sha256(raw).hexdigest(),
            "bytes": len(raw),
            "preview": text[:PREVIEW_CHARS],
            "truncated": True,
        }
    }


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    tail = f"... ({len(text)} characters in all)"
    return text[: limit - len(tail)] + tail
