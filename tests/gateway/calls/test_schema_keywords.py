"""Writ's pattern keywords decide as jsonschema's do: every schema here, every instance, the same errors."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from referencing import Registry

from gateway.calls.schema_keywords import timed_validator

CLOSED: dict[str, dict[str, Any]] = {
    "properties": {"properties": {"a": {}}, "unevaluatedProperties": False},
    "patternProperties": {"patternProperties": {"^b": {}}, "unevaluatedProperties": False},
    "additionalProperties": {
        "properties": {"a": {"type": "integer"}},
        "additionalProperties": {"type": "string"},
        "unevaluatedProperties": False,
    },
    "additionalProperties beside patternProperties": {
        "patternProperties": {"^b": {"type": "integer"}},
        "additionalProperties": {"type": "string"},
        "unevaluatedProperties": False,
    },
    "a subschema of its own": {"properties": {"a": {}}, "unevaluatedProperties": {"type": "integer"}},
    "nested unevaluatedProperties": {
        "allOf": [{"properties": {"a": {}}, "unevaluatedProperties": {"type": "integer"}}],
        "unevaluatedProperties": False,
    },
    "$ref": {
        "$defs": {"base": {"properties": {"a": {}}, "patternProperties": {"^b": {"type": "integer"}}}},
        "$ref": "#/$defs/base",
        "properties": {"c": {}},
        "unevaluatedProperties": False,
    },
    "$ref from a subschema": {
        "$defs": {
            "closed": {"$ref": "#/$defs/open", "unevaluatedProperties": False},
            "open": {"properties": {"a": {}}, "dependentSchemas": {"a": {"$ref": "#/$defs/more"}}},
            "more": {"patternProperties": {"^b": {}}},
        },
        "properties": {"x": {"$ref": "#/$defs/closed"}},
        "unevaluatedProperties": False,
    },
    "$ref within an embedded resource": {
        "$id": "https://example.com/root",
        "$defs": {
            "item": {
                "$id": "item",
                "$defs": {"a": {"properties": {"a": {}}}},
                "$ref": "#/$defs/a",
                "unevaluatedProperties": False,
            },
            "a": {"properties": {"b": {}}},
        },
        "properties": {"x": {"$ref": "item"}},
    },
    "$ref to an anchor and to the root": {
        "$defs": {"named": {"$anchor": "named", "properties": {"a": {}}}},
        "properties": {"x": {"$ref": "#"}},
        "allOf": [{"$ref": "#named"}],
        "unevaluatedProperties": False,
    },
    # A base schema extended by the one that refers to it (the JSON Schema Test Suite's case).
    "$dynamicRef": {
        "$id": "https://example.com/derived",
        "$ref": "base",
        "$defs": {
            "extension": {"$dynamicAnchor": "extra", "properties": {"b": {"type": "string"}}},
            "base": {
                "$id": "base",
                "unevaluatedProperties": False,
                "properties": {"a": {}},
                "$dynamicRef": "#extra",
                "$defs": {"none": {"$dynamicAnchor": "extra"}},
            },
        },
    },
    "allOf": {
        "allOf": [{"properties": {"a": {}}}, {"patternProperties": {"^b": {}}}],
        "unevaluatedProperties": False,
    },
    "anyOf": {
        "anyOf": [
            {"properties": {"a": {"type": "integer"}}, "required": ["a"]},
            {"properties": {"b": {"type": "string"}}, "required": ["b"]},
            {"patternProperties": {"^c": {"type": "null"}}},
        ],
        "unevaluatedProperties": False,
    },
    "oneOf": {
        "oneOf": [
            {"properties": {"a": {"type": "integer"}}, "required": ["a"]},
            {"patternProperties": {"^b": {"type": "string"}}, "required": ["bc"]},
        ],
        "unevaluatedProperties": False,
    },
    "if, then, else": {
        "if": {"properties": {"a": {"const": 1}}, "required": ["a"]},
        "then": {"properties": {"b": {}}},
        "else": {"patternProperties": {"^c": {}}},
        "unevaluatedProperties": False,
    },
    "if alone": {"if": {"patternProperties": {"^b": {"type": "integer"}}}, "unevaluatedProperties": False},
    "dependentSchemas": {
        "properties": {"a": {}},
        "dependentSchemas": {"a": {"properties": {"b": {}}}, "x": {"patternProperties": {"^c": {}}}},
        "unevaluatedProperties": False,
    },
    "not": {
        "not": {"properties": {"b": {"const": 1}}, "required": ["b"]},
        "properties": {"a": {}},
        "unevaluatedProperties": False,
    },
    "true and false": {
        "allOf": [True, {"properties": {"a": {}}}],
        "anyOf": [False, True],
        "unevaluatedProperties": False,
    },
    "unevaluatedProperties true": {"properties": {"a": {"type": "integer"}}, "unevaluatedProperties": True},
}

KEYS = ("a", "b", "bc", "c", "x")
VALUES = (1, 2, "s", None, {}, {"a": 1}, {"b": "s"}, {"c": None}, {"x": {"a": 1, "c": 1}})
instances = st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=4)


def _errors(validator: Any, instance: Any) -> list[tuple[str, str, str]]:
    return sorted((str(list(e.path)), str(e.validator), e.message) for e in validator.iter_errors(instance))


@pytest.mark.parametrize("name", CLOSED)
@given(instance=instances)
def test_unevaluated_properties_finds_the_same_errors_as_jsonschema_through_every_applicator(
    name: str, instance: dict[str, Any]
) -> None:
    schema = CLOSED[name]
    plain = Draft202012Validator(schema, registry=Registry())

    assert _errors(timed_validator(schema), instance) == _errors(plain, instance)


def test_the_schemas_compared_are_each_met_and_broken_by_some_instance() -> None:
    # So that agreeing is not agreeing on nothing: each schema lets one instance through and refuses one.
    for schema in CLOSED.values():
        if schema.get("unevaluatedProperties") is True:
            continue
        plain = Draft202012Validator(schema, registry=Registry())
        assert plain.is_valid({"a": 1}) or plain.is_valid({"bc": "s"}) or plain.is_valid({})
        assert not plain.is_valid({"zz": 1, "x": {"zz": 1}})


def test_a_key_that_breaks_the_unevaluated_subschema_twice_is_named_once() -> None:
    # jsonschema names it once per error ('x', 'x' were ...): the one place Writ's message differs.
    schema = {"unevaluatedProperties": {"type": "string", "not": {"type": "integer"}}}

    [error] = timed_validator(schema).iter_errors({"x": 1})

    assert error.message == (
        "Unevaluated properties are not valid under the given schema ('x' was unevaluated and invalid)"
    )


def test_a_ref_in_a_subschema_with_its_own_id_is_resolved_against_that_id() -> None:
    # As jsonschema validates the subschema; its unevaluatedProperties helper resolves such a `$ref`
    # against the outer `$id` instead (here the root's `#/$defs/a`, which admits `b`).
    schema = {
        "$id": "https://example.com/root",
        "$defs": {"a": {"properties": {"b": {}}}},
        "allOf": [{"$id": "part", "$defs": {"a": {"properties": {"a": {}}}}, "$ref": "#/$defs/a"}],
        "unevaluatedProperties": False,
    }
    validator = timed_validator(schema)

    assert validator.is_valid({"a": 1})
    assert [e.message for e in validator.iter_errors({"b": 1})] == [
        "Unevaluated properties are not allowed ('b' was unexpected)"
    ]
