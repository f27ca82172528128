"""The Draft 2020-12 keywords that match patterns, matched by the `regex` module under a time limit.

jsonschema matches `pattern` (and the keys of `patternProperties`) with `re`, which backtracks without
end on a pattern such as `^(a+)+$` and keeps the GIL while it does: one argument of 35 characters froze
the event loop for minutes. Here each match is given `PATTERN_TIMEOUT_S`, and one that runs over raises
`PatternTimeout`, which ends the check.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import regex
from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError

PATTERN_TIMEOUT_S = 0.1
"""How long one `pattern` may take to match one string (a sane one takes microseconds)."""


class PatternTimeout(Exception):
    """A pattern did not match or fail within `PATTERN_TIMEOUT_S`: the arguments are not checked."""

    def __init__(self, pattern: str, what: str) -> None:
        super().__init__(
            f"(arguments): {what} could not be checked against the pattern {pattern!r} within "
            f"{PATTERN_TIMEOUT_S:g} s, so the call is not run"
        )


def _search(pattern: str, text: str, what: str) -> bool:
    try:
        return regex.search(pattern, text, timeout=PATTERN_TIMEOUT_S) is not None
    except TimeoutError:
        raise PatternTimeout(pattern, what) from None


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Any:
    if validator.is_type(instance, "string") and not _search(pattern, instance, "a string"):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(validator: Any, properties: Mapping[str, Any], instance: Any, schema: Any) -> Any:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in properties.items():
        for key, value in instance.items():
            if _search(pattern, key, "a property name"):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


_ADDITIONAL = Draft202012Validator.VALIDATORS["additionalProperties"]


def _additional_properties(validator: Any, allowed: Any, instance: Any, schema: Any) -> Any:
    """`additionalProperties`, whose extras are the keys no `properties` names and no
    `patternProperties` key matches: those matched under the time limit too (jsonschema's own keyword
    matches them with `re`)."""
    patterns = schema.get("patternProperties")
    if not patterns or not validator.is_type(instance, "object"):
        yield from _ADDITIONAL(validator, allowed, instance, schema)
        return
    named = schema.get("properties", {})
    extras = sorted(
        key
        for key in instance
        if key not in named and not any(_search(p, key, "a property name") for p in patterns)
    )
    if validator.is_type(allowed, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], allowed, path=extra)
    elif not allowed and extras:
        verb = "does" if len(extras) == 1 else "do"
        joined = ", ".join(repr(each) for each in extras)
        yield ValidationError(
            f"{joined} {verb} not match any of the regexes: {', '.join(repr(p) for p in sorted(patterns))}"
        )


# Draft 2020-12 with the keywords that match patterns matched under a time limit (jsonschema's
# documented way of changing a keyword: `validators.extend`). `unevaluatedProperties` beside
# `patternProperties` still matches with `re` (jsonschema's helper, which walks every applicator).
TimedValidator = validators.extend(
    Draft202012Validator,
    {
        "pattern": _pattern,
        "patternProperties": _pattern_properties,
        "additionalProperties": _additional_properties,
    },
)
