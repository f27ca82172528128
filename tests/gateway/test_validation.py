"""Arguments against the input schema: every error named, none of them carrying the whole argument."""

from __future__ import annotations

from capabilities.contract import Capability
from gateway.validation import MAX_ERROR_CHARS, MAX_ERRORS, InputSchemas

SCHEMA = {
    "type": "object",
    "properties": {"reason": {"type": "string", "maxLength": 5}, "amount": {"type": "number"}},
    "additionalProperties": False,
}
CAP = Capability(id="refund", version="1", tool_name="refund", backend="b", input_schema=SCHEMA)


def test_an_error_about_a_huge_value_is_clipped_and_says_how_long_it_was() -> None:
    # jsonschema quotes the value: a 4 MB reason came back to the client twice and was recorded again.
    errors = InputSchemas().errors(CAP, {"reason": "x" * 1_000_000})
    assert len(errors) == 1
    assert errors[0].startswith("reason: 'xxx") and len(errors[0]) <= MAX_ERROR_CHARS
    assert "characters in all" in errors[0]


def test_unexpected_keys_by_the_thousand_make_one_short_error() -> None:
    errors = InputSchemas().errors(CAP, {f"k{i}": i for i in range(100_000)})
    assert len(errors) == 1 and len(errors[0]) <= MAX_ERROR_CHARS
    assert "Additional properties are not allowed" in errors[0]


def test_short_errors_are_unchanged_and_at_most_ten_are_listed() -> None:
    assert InputSchemas().errors(CAP, {"amount": "5"}) == ["amount: '5' is not of type 'number'"]
    many = {"type": "array", "items": {"type": "string"}}
    cap = Capability(id="list", version="1", tool_name="list", backend="b", input_schema=many)
    assert len(InputSchemas().errors(cap, list(range(50)))) == MAX_ERRORS  # type: ignore[arg-type]
