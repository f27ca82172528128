"""Arguments against the input schema: every error named, none of them carrying the whole argument."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, ClassVar

import pytest

from capabilities.contract import Capability
from gateway.calls.validation import MAX_ERROR_CHARS, MAX_ERRORS, SCHEMA_LOOPS, InputSchemas
from gateway.errors import ConfigurationError

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


CARD_SCHEMA = {
    "type": "object",
    "properties": {
        "card": {"type": "string", "pattern": "^tok_"},
        "wallet": {"type": "object", "additionalProperties": {"type": "integer"}},
        "note": {"type": "string", "maxLength": 3},
    },
    "maxProperties": 3,
    "required": ["card"],
}
CARD_CAP = Capability(
    id="charge",
    version="1",
    tool_name="charge",
    backend="b",
    input_schema=CARD_SCHEMA,
    redact=("card", "wallet"),
)
CARD = "4111111111111111"


def test_an_error_on_a_redacted_field_names_the_field_and_the_rule_never_the_value() -> None:
    errors = InputSchemas().errors(CARD_CAP, {"card": CARD})

    assert errors == ["card: a redacted value fails the schema rule pattern '^tok_' (value not shown)"]


def test_an_error_on_all_the_arguments_or_below_a_redacted_field_quotes_none_of_it() -> None:
    # maxProperties quotes the whole arguments; below a redacted field even the keys are its value.
    arguments = {"card": CARD, "wallet": {"acct-77": "x"}, "note": "ok", "extra": 1}

    errors = InputSchemas().errors(CARD_CAP, arguments)

    assert errors == [
        "(arguments): the arguments fails the schema rule maxProperties 3 (value not shown)",
        "card: a redacted value fails the schema rule pattern '^tok_' (value not shown)",
        "wallet: a redacted value fails the schema rule type 'integer' (value not shown)",
    ]
    assert not any(CARD in e or "acct-77" in e for e in errors)


def test_errors_on_other_fields_and_missing_fields_keep_their_messages() -> None:
    errors = InputSchemas().errors(CARD_CAP, {"note": "long"})

    assert errors == ["(arguments): 'card' is a required property", "note: 'long' is too long"]


class _Recording(BaseHTTPRequestHandler):
    hits: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.hits.append(self.path)
        body = json.dumps({"type": "string"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/schema+json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_a_schema_referring_to_a_url_is_refused_and_the_url_is_never_fetched() -> None:
    # jsonschema fetched such a `$ref` itself, on the event loop: an upstream's tool pointing at a server
    # that never answered froze the gateway, and Writ sent requests wherever the upstream chose.
    server = HTTPServer(("127.0.0.1", 0), _Recording)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/schema.json"
        schema = {"type": "object", "properties": {"s": {"$ref": url}}}
        cap = Capability(id="remote", version="1", tool_name="remote", backend="b", input_schema=schema)
        with pytest.raises(ConfigurationError, match="refers outside itself") as refused:
            InputSchemas().check(cap)
        assert url in str(refused.value)
        with pytest.raises(ConfigurationError):
            InputSchemas().errors(cap, {"s": "x"})
    finally:
        server.shutdown()
        server.server_close()
    assert _Recording.hits == []


def test_refs_within_the_schema_resolve_and_one_naming_nothing_is_a_configuration_error() -> None:
    within = {
        "$id": "https://example.com/refund",
        "type": "object",
        "$defs": {"amount": {"type": "number", "minimum": 0}, "id": {"$id": "order-id", "type": "string"}},
        "properties": {"amount": {"$ref": "#/$defs/amount"}, "order": {"$ref": "order-id"}},
    }
    cap = Capability(id="r", version="1", tool_name="r", backend="b", input_schema=within)
    assert InputSchemas().errors(cap, {"amount": 5, "order": "1001"}) == []
    assert InputSchemas().errors(cap, {"amount": -1, "order": 7}) == [
        "amount: -1 is less than the minimum of 0",
        "order: 7 is not of type 'string'",
    ]
    dangling = {"type": "object", "properties": {"amount": {"$ref": "#/$defs/missing"}}}
    cap = Capability(id="d", version="1", tool_name="d", backend="b", input_schema=dangling)
    with pytest.raises(ConfigurationError, match="d@1: input schema"):
        InputSchemas().errors(cap, {"amount": 5})


@pytest.mark.parametrize(
    "schema",
    [
        {"allOf": [{"$ref": "#"}]},
        {"type": "object", "unevaluatedProperties": False, "anyOf": [{"$ref": "#"}]},
        {"$defs": {"x": {"$ref": "#/$defs/x"}}, "$ref": "#/$defs/x"},
    ],
)
def test_a_schema_that_refers_to_itself_without_end_refuses_the_arguments(schema: dict[str, Any]) -> None:
    cap = Capability(id="loop", version="1", tool_name="loop", backend="b", input_schema=schema)
    assert InputSchemas().errors(cap, {"a": 1}) == [SCHEMA_LOOPS]
    # A recursive schema that descends through the arguments is no loop: it ends where they do.
    tree = {"type": "object", "properties": {"child": {"$ref": "#"}, "n": {"type": "integer"}}}
    cap = Capability(id="tree", version="1", tool_name="tree", backend="b", input_schema=tree)
    assert InputSchemas().errors(cap, {"child": {"child": {"n": 1}}}) == []
    assert InputSchemas().errors(cap, {"child": {"child": {"n": "x"}}}) == [
        "child/child/n: 'x' is not of type 'integer'"
    ]


# `^(a+)+$`, the tester's, held `re` for seconds and `regex` not at all; `^(a|aa)+$` backtracks in both.
BACKTRACKS = {
    "type": "object",
    "properties": {
        "s": {"type": "string", "pattern": "^(a|aa)+$"},
        "t": {"type": "string", "pattern": "^(a+)+$"},
    },
    "patternProperties": {"^(b|bb)+$": {"type": "integer"}},
}
BACKTRACKING = Capability(id="bt", version="1", tool_name="bt", backend="b", input_schema=BACKTRACKS)


def test_a_pattern_that_backtracks_without_end_refuses_the_arguments_instead_of_holding_the_loop() -> None:
    # With `re`, "a" * 27 + "!" held the event loop for 4.7 s, and each more "a" doubles it.
    [said] = InputSchemas().errors(BACKTRACKING, {"s": "a" * 40 + "!"})
    assert said == (
        "(arguments): a string could not be checked against the pattern '^(a|aa)+$' within 0.1 s, "
        "so the call is not run"
    )
    [said] = InputSchemas().errors(BACKTRACKING, {"b" * 40 + "!": 1})
    assert "a property name could not be checked against the pattern '^(b|bb)+$'" in said
    # additionalProperties looks for the keys patternProperties matches too: there also under the limit
    # (first in the schema, so that it runs before patternProperties does).
    closed = Capability(
        id="closed",
        version="1",
        tool_name="closed",
        backend="b",
        input_schema={"additionalProperties": False, **BACKTRACKS},
    )
    # With `re` this one would take hours: the test's timeout, not a wrong answer, would fail it.
    [said] = InputSchemas().errors(closed, {"b" * 60 + "!": 1})
    assert "a property name could not be checked against the pattern '^(b|bb)+$'" in said
    assert InputSchemas().errors(BACKTRACKING, {"t": "a" * 40 + "!"}) == [
        f"t: '{'a' * 40}!' does not match '^(a+)+$'"
    ]


# unevaluatedProperties looks for the keys patternProperties matches wherever its applicators lead, and
# runs first here: with `re`, each of these took hours (the test's timeout, not a wrong answer, fails it).
PATTERN_PROPERTIES = {"patternProperties": {"^(b|bb)+$": {"type": "integer"}}}
BESIDE_UNEVALUATED = {
    "beside it": {"unevaluatedProperties": False, **PATTERN_PROPERTIES},
    "$ref": {"unevaluatedProperties": False, "$ref": "#/$defs/p", "$defs": {"p": PATTERN_PROPERTIES}},
    "dependentSchemas": {
        "unevaluatedProperties": False,
        "dependentSchemas": {"b" * 60 + "!": PATTERN_PROPERTIES},
    },
    "then": {"unevaluatedProperties": False, "if": True, "then": PATTERN_PROPERTIES},
    "allOf": {"unevaluatedProperties": False, "allOf": [PATTERN_PROPERTIES]},
    "nested": {
        "unevaluatedProperties": False,
        "anyOf": [{"unevaluatedProperties": {"type": "integer"}, **PATTERN_PROPERTIES}],
    },
}


@pytest.mark.parametrize("where", BESIDE_UNEVALUATED)
def test_unevaluated_properties_matches_pattern_properties_in_time_wherever_they_are(where: str) -> None:
    schema = {"type": "object", **BESIDE_UNEVALUATED[where]}
    cap = Capability(id="u", version="1", tool_name="u", backend="b", input_schema=schema)

    [said] = InputSchemas().errors(cap, {"b" * 60 + "!": 1})

    assert said == (
        "(arguments): a property name could not be checked against the pattern '^(b|bb)+$' within "
        "0.1 s, so the call is not run"
    )


def test_unevaluated_properties_answers_where_only_re_backtracks() -> None:
    # `^(b+)+$` held `re` for hours on this key; `regex` says at once that it does not match.
    schema = {"unevaluatedProperties": False, "patternProperties": {"^(b+)+$": {}}}
    cap = Capability(id="u", version="1", tool_name="u", backend="b", input_schema=schema)
    key = "b" * 60 + "!"

    assert InputSchemas().errors(cap, {key: 1}) == [
        f"(arguments): Unevaluated properties are not allowed ('{key}' was unexpected)"
    ]
    assert InputSchemas().errors(cap, {"bbb": 1}) == []


def test_unevaluated_items_and_property_names_match_their_patterns_in_time() -> None:
    # Neither reaches `re`: unevaluatedItems asks each item's validity of Writ's keywords, and
    # propertyNames checks a key with `pattern`. (`format: regex` only compiles, and no format is
    # asserted: the validator has no format checker.)
    items = {"unevaluatedItems": False, "contains": {"pattern": "^(a|aa)+$"}}
    cap = Capability(id="i", version="1", tool_name="i", backend="b", input_schema=items)
    [said] = InputSchemas().errors(cap, ["a" * 60 + "!"])  # type: ignore[arg-type]
    assert said.startswith("(arguments): a string could not be checked against the pattern '^(a|aa)+$'")

    names = {"propertyNames": {"pattern": "^(b|bb)+$"}}
    cap = Capability(id="n", version="1", tool_name="n", backend="b", input_schema=names)
    [said] = InputSchemas().errors(cap, {"b" * 60 + "!": 1})
    assert said.startswith("(arguments): a string could not be checked against the pattern '^(b|bb)+$'")


# jsonschema validates a subschema that names a `$schema` with its stock validator for that draft, which
# matches with `re`: before, each of these held the loop for hours.
NAMING_A_DIALECT = {
    "in a subschema": {
        "properties": {
            "s": {"$schema": "https://json-schema.org/draft/2020-12/schema", "pattern": "^(a|aa)+$"}
        },
    },
    "at the root, reached again by $ref": {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "properties": {"s": {"pattern": "^(a|aa)+$"}, "child": {"$ref": "#"}},
    },
}


@pytest.mark.parametrize("where", NAMING_A_DIALECT)
def test_a_schema_naming_its_dialect_still_matches_patterns_in_time(where: str) -> None:
    schema = NAMING_A_DIALECT[where]
    cap = Capability(id="d", version="1", tool_name="d", backend="b", input_schema=schema)
    arguments = {"s": "a" * 60 + "!"}

    [said] = InputSchemas().errors(cap, arguments if "root" not in where else {"child": arguments})

    assert said.startswith("(arguments): a string could not be checked against the pattern '^(a|aa)+$'")
    assert InputSchemas().errors(cap, {"s": "aaa"}) == []


def test_patterns_still_match_and_fail_as_json_schema_says() -> None:
    schemas = InputSchemas()
    assert schemas.errors(BACKTRACKING, {"s": "aaaa", "bbb": 7}) == []
    assert schemas.errors(BACKTRACKING, {"s": "ab"}) == ["s: 'ab' does not match '^(a|aa)+$'"]
    assert schemas.errors(BACKTRACKING, {"bb": "x"}) == ["bb: 'x' is not of type 'integer'"]
    closed = {**BACKTRACKS, "additionalProperties": False}
    cap = Capability(id="c", version="1", tool_name="c", backend="b", input_schema=closed)
    assert schemas.errors(cap, {"s": "a", "bb": 1}) == []
    assert schemas.errors(cap, {"x": 1, "y": 2}) == [
        "(arguments): 'x', 'y' do not match any of the regexes: '^(b|bb)+$'"
    ]
    typed = {**BACKTRACKS, "additionalProperties": {"type": "boolean"}}
    cap = Capability(id="t", version="1", tool_name="t", backend="b", input_schema=typed)
    assert schemas.errors(cap, {"x": True, "y": 2}) == ["y: 2 is not of type 'boolean'"]
