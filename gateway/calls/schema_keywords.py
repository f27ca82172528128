"""The Draft 2020-12 keywords that match patterns, matched by the `regex` module under a time limit.

jsonschema matches `pattern` (and the keys of `patternProperties`) with `re`, which backtracks without
end on a pattern such as `^(a+)+$` and keeps the GIL while it does: one argument of 35 characters froze
the event loop for minutes. Here each match is given `PATTERN_TIMEOUT_S`, and one that runs over raises
`PatternTimeout`, which ends the check.

`additionalProperties` and `unevaluatedProperties` find the keys `patternProperties` matches, so they
are replaced too; the other keywords reach patterns only through the validator's own keywords (`pattern`
in `propertyNames`, say), and `format: regex` is never asserted (the validator has no format checker).
`unevaluatedProperties` finds the keys evaluated by following every applicator (`$ref`, `allOf`,
`if`...), as jsonschema's own helper does, which matches with `re` and which this module cannot
import (private); tests/gateway/calls/test_schema_keywords.py holds the two to the same answers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import regex
from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError
from referencing import Registry
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

_Resolver = Any
"""A `referencing` Resolver (which the package does not export): where a `$ref` is resolved from."""

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


def _unevaluated_properties(scopes: _Scopes) -> Any:
    """`unevaluatedProperties`, whose evaluated keys `_evaluated_keys` finds (jsonschema's own keyword
    finds them with a helper that matches `patternProperties` with `re`)."""

    def keyword(validator: Any, unevaluated: Any, instance: Any, schema: Any) -> Any:
        if not validator.is_type(instance, "object"):
            return
        evaluated = _evaluated_keys(validator, scopes.of(schema), instance, schema)
        # jsonschema names a key once per error under the subschema; here once.
        failing = [
            key
            for key, value in instance.items()
            if key not in evaluated
            and next(validator.descend(value, unevaluated, path=key), None) is not None
        ]
        if not failing:
            return
        verb = "was" if len(failing) == 1 else "were"
        if unevaluated is False:
            joined = ", ".join(repr(key) for key in sorted(failing))
            yield ValidationError(f"Unevaluated properties are not allowed ({joined} {verb} unexpected)")
        else:
            joined = ", ".join(repr(key) for key in failing)
            yield ValidationError(
                "Unevaluated properties are not valid under the given schema "
                f"({joined} {verb} unevaluated and invalid)"
            )

    return keyword


def _evaluated_keys(
    validator: Any, resolver: _Resolver, instance: Mapping[str, Any], schema: Any
) -> set[str]:
    """The keys of `instance` that `schema` and the applicators in it evaluate, as jsonschema counts them
    for `unevaluatedProperties` (keyword for keyword), with `patternProperties` matched in time.

    `resolver` resolves a `$ref` where `schema` stands. A subschema is valid or not as `validator` finds.
    """
    if not isinstance(schema, Mapping):  # true and false evaluate nothing
        return set()

    def scoped(subschema: Any) -> _Resolver:
        return resolver.in_subresource(DRAFT202012.create_resource(subschema))

    def valid(value: Any, subschema: Any) -> bool:
        return next(validator.descend(value, subschema, resolver=scoped(subschema)), None) is None

    def evaluated_by(subschema: Any) -> set[str]:
        return _evaluated_keys(validator, scoped(subschema), instance, subschema)

    keys: set[str] = set()
    # jsonschema looks a `$dynamicRef` up as it would a `$ref` here.
    for ref in (schema.get("$ref"), schema.get("$dynamicRef")):
        if ref is not None:
            resolved = resolver.lookup(ref)
            keys |= _evaluated_keys(validator, resolved.resolver, instance, resolved.contents)
    if isinstance(properties := schema.get("properties"), Mapping):
        keys |= properties.keys() & instance.keys()
    for keyword in ("additionalProperties", "unevaluatedProperties"):
        if (subschema := schema.get(keyword)) is not None:
            keys |= {key for key, value in instance.items() if valid(value, subschema)}
    for pattern in schema.get("patternProperties", {}):
        keys |= {key for key in instance if _search(pattern, key, "a property name")}
    for name, subschema in schema.get("dependentSchemas", {}).items():
        if name in instance:
            keys |= evaluated_by(subschema)
    for keyword in ("allOf", "anyOf", "oneOf"):
        for subschema in schema.get(keyword, []):
            if valid(instance, subschema):
                keys |= evaluated_by(subschema)
    if "if" in schema:
        if valid(instance, schema["if"]):
            keys |= evaluated_by(schema["if"])
            if "then" in schema:
                keys |= evaluated_by(schema["then"])
        elif "else" in schema:
            keys |= evaluated_by(schema["else"])
    return keys


class _Scopes:
    """Where each subschema of a schema resolves a `$ref` (its base URI: the nearest `$id` around it).

    jsonschema hands a keyword the subschema it stands in, not where that is; so each subschema is
    found here by identity (jsonschema validates the very objects of the schema it was given).
    """

    def __init__(self, root: Mapping[str, Any]) -> None:
        self._root = Registry().resolver_with_root(DRAFT202012.create_resource(root))
        self._of: dict[int, tuple[Any, _Resolver]] = {}
        self._walk(root, self._root)

    def _walk(self, node: Any, resolver: _Resolver) -> None:
        if isinstance(node, Mapping):
            if isinstance(node.get("$id"), str):
                resolver = self._entered(node, resolver)
            self._of[id(node)] = (node, resolver)  # the node is kept, so its id stays its own
            for value in node.values():
                self._walk(value, resolver)
        elif isinstance(node, list):
            for item in node:
                self._walk(item, resolver)

    @staticmethod
    def _entered(resource: Mapping[str, Any], around: _Resolver) -> _Resolver:
        """Where `resource` (a subschema with an `$id`) resolves, with the resources around it in its
        dynamic scope, as if a `$ref` had led into each: there a `$dynamicRef` looks first."""
        try:
            return around.lookup(resource["$id"]).resolver
        except Unresolvable:  # not a schema but a value (of `const`, say) that has an `$id`
            return around.in_subresource(DRAFT202012.create_resource(resource))

    def of(self, schema: Any) -> _Resolver:
        """Where `schema`, a mapping within the root, resolves (the root's resolver for any other)."""
        return self._of.get(id(schema), (schema, self._root))[1]


def timed_validator(schema: Mapping[str, Any]) -> Any:
    """A Draft 2020-12 validator for `schema` whose keywords match patterns under the time limit, on a
    registry of nothing: no `$ref` is ever fetched, whatever the schema says (referencing's default).

    Built per schema (jsonschema's documented way of changing a keyword: `validators.extend`), as
    `unevaluatedProperties` resolves the `$ref`s it follows itself. The schema is read as Draft 2020-12
    throughout, as its root always was: jsonschema validates a subschema that names a `$schema` (or the
    root, reached again by `$ref`) with its stock validator for that draft, whose keywords match with
    `re`, so a copy without them is what is validated.
    """
    read = _without_dialects(schema)
    keywords = {
        "pattern": _pattern,
        "patternProperties": _pattern_properties,
        "additionalProperties": _additional_properties,
        "unevaluatedProperties": _unevaluated_properties(_Scopes(read)),
    }
    return validators.extend(Draft202012Validator, keywords)(read, registry=Registry())


def _without_dialects(node: Any) -> Any:
    """A copy of `node` without a `$schema` naming a dialect (a string) in any mapping."""
    if isinstance(node, Mapping):
        return {
            key: _without_dialects(value)
            for key, value in node.items()
            if not (key == "$schema" and isinstance(value, str))
        }
    if isinstance(node, list):
        return [_without_dialects(item) for item in node]
    return node
