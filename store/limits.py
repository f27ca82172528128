"""How long each identifier Writ stores may be: one set of limits, checked at every edge.

The columns that hold these are at least this long (tests/store/test_limits.py checks it), so a value
within its limit fits both stores alike: SQLite would keep a longer one where PostgreSQL refuses it
(a database error, answered as an internal error after the call was half done). Neither stores NUL
(PostgreSQL's text cannot) or an unpaired surrogate (no UTF-8 encodes it).
"""

from __future__ import annotations

TENANT_CHARS = 128
"""A tenant (token claim, CLI `--tenant`)."""
SUBJECT_CHARS = 255
"""A subject: who a token speaks for, who decided, who revoked or resolved."""
NAME_CHARS = 255
"""A role, group or scope name and a token's client id."""
CLIENT_ID_CHARS = 255
"""A client's `writ/runId` or `writ/idempotencyKey`."""


def unfit(value: str, limit: int) -> str | None:
    """Why `value` cannot be stored as a name of 1 to `limit` characters, or None when it can.

    Control, format (bidi overrides, zero-width) and unpaired surrogate characters are refused with
    NUL: a name is shown to approvers and auditors, and should read as what it is.
    """
    if not value:
        return "is empty"
    if len(value) > limit:
        return f"is {len(value)} characters long, over the limit of {limit}"
    if not value.isprintable():
        return "contains a control, format or unpaired surrogate character"
    if value != value.strip():
        return "has surrounding spaces"
    return None


def text_unfit(value: str) -> str | None:
    """Why free text (a reason, evidence) cannot be stored, or None when it can; its length is the
    edge's to bound (Text columns have none)."""
    if "\x00" in value:
        return "contains NUL, which PostgreSQL cannot store"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "contains an unpaired surrogate, which no UTF-8 text can hold"
    return None


def refusal(what: str, value: str, limit: int) -> str | None:
    """The message refusing `value` as `what` (a claim, a flag, a path segment), or None if it fits."""
    why = unfit(value, limit)
    return None if why is None else f"{what} {why} (1 to {limit} printable characters)"
