"""Arguments against a capability's input schema: checked once at startup, applied on every call.

Patterns in the schema are matched under a time limit (gateway/calls/schema_keywords.py): an argument
that cannot be checked in time is refused, and the check ends there.

A schema is used whole, as it came: a `$ref` is resolved only within it. jsonschema given no registry
fetches a `$ref` to a URL itself, synchronously: an upstream's tool whose schema pointed at a server
that never answered froze the event loop (every tenant's calls, the API, the workers) and made Writ
send a request wherever the upstream chose. A schema that refers outside itself is refused like an
invalid one, and validators are built on a registry that retrieves nothing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, ValidationError
from referencing.exceptions import Unresolvable

from capabilities.contract import Capability
from gateway.calls.actions import PerCapability, canonical_json
from gateway.calls.schema_keywords import PatternTimeout, timed_validator
from gateway.errors import ConfigurationError

MAX_ERRORS = 10
SCHEMA_LOOPS = (
    "(arguments): the tool's input schema refers to itself without end (a `$ref` cycle), so they "
    "cannot be checked and the call is not run"
)
MAX_ERROR_CHARS = 300
"""How long one error may be. jsonschema quotes the offending value (`'xxx…' is too long`) or every
unexpected key: a 4 MB argument came back to the client twice and was recorded again in the refusal."""


class InputSchemas:
    """Compiled validators, one per capability version and schema, built once and reused."""

    def __init__(self) -> None:
        self._validators: dict[tuple[str, str], Draft202012Validator] = {}
        self._of: PerCapability[Draft202012Validator] = PerCapability(self._validator)

    def check(self, capability: Capability) -> Draft202012Validator:
        """The validator for `capability`, found without spelling its schema again on every call.

        Raises:
            ConfigurationError: its input schema is not a valid JSON Schema.
        """
        return self._of(capability)

    def _validator(self, capability: Capability) -> Draft202012Validator:
        # An upstream MCP server may change a tool's schema under the same version (Writ discovers it
        # again), so the schema itself is part of the key.
        key = (capability.ref, canonical_json(capability.input_schema))
        validator = self._validators.get(key)
        if validator is None:
            try:
                Draft202012Validator.check_schema(dict(capability.input_schema))
            except SchemaError as exc:
                raise ConfigurationError(f"{capability.ref}: invalid input schema: {exc.message}") from exc
            if outside := external_refs(capability.input_schema):
                named = ", ".join(map(repr, outside))
                raise ConfigurationError(
                    f"{capability.ref}: input schema refers outside itself ({named}), which Writ does "
                    "not fetch: a tool's schema must be whole"
                )
            validator = timed_validator(dict(capability.input_schema))
            self._validators[key] = validator
        return validator

    def errors(self, capability: Capability, arguments: Mapping[str, Any]) -> list[str]:
        """Every way `arguments` break the schema (at most ten), as `path: message`; empty if valid.

        Raises:
            ConfigurationError: the schema is invalid, or a `$ref` in it names nothing within it.
        """
        try:
            found = sorted(self.check(capability).iter_errors(arguments), key=lambda e: list(e.path))
        except Unresolvable as exc:
            raise ConfigurationError(f"{capability.ref}: input schema: {exc}") from exc
        except PatternTimeout as exc:
            return [_clipped(str(exc))]
        except RecursionError:
            # A `$ref` that leads back to itself through no property (`allOf: [{$ref: "#"}]`) checks
            # the same arguments again without end: an upstream's schema may say so, and Python stops it.
            return [SCHEMA_LOOPS]
        return [_clipped(_described(e, capability.redact)) for e in found[:MAX_ERRORS]]


_REFS = ("$ref", "$dynamicRef")


def external_refs(schema: Any) -> list[str]:
    """The `$ref`s (and `$dynamicRef`s) of `schema` that point outside it: anything but a fragment
    (`#/$defs/x`, `#anchor`) or an `$id` the schema itself declares."""
    refs: list[str] = []
    ids: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, Mapping):
            for key, value in node.items():
                if key in _REFS and isinstance(value, str):
                    refs.append(value)
                elif key == "$id" and isinstance(value, str):
                    ids.add(value.split("#", 1)[0])
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(schema)
    return [ref for ref in refs if not ref.startswith("#") and ref.split("#", 1)[0] not in ids]


_NAMES_ONLY = frozenset({"required", "additionalProperties", "unevaluatedProperties", "dependentRequired"})
"""Rules whose jsonschema message quotes property names, never a value."""


def _described(error: ValidationError, redact: tuple[str, ...]) -> str:
    """`path: message`; where the failing value is or holds a redacted field, the field and the rule.

    jsonschema's messages quote the value (`'4111 1111 1111 1111' does not match '^tok_'`), and an error
    on the arguments as a whole quotes all of them. The text is stored in the refusal, hash-chained,
    exported and returned, so for a redacted value it is built from the schema's side alone.
    """
    path = list(error.path)
    if not redact or (path and path[0] not in redact) or (not path and error.validator in _NAMES_ONLY):
        return f"{'/'.join(map(str, path)) or '(arguments)'}: {error.message}"
    # Below a redacted field, even the keys are its value.
    where = str(path[0]) if path else "(arguments)"
    rule = str(error.validator)
    value = error.validator_value
    if isinstance(value, str | int | float | bool) or (
        isinstance(value, list) and all(isinstance(item, str | int | float | bool) for item in value)
    ):
        rule = f"{rule} {value!r}"
    hidden = "a redacted value" if path else "the arguments"
    return f"{where}: {hidden} fails the schema rule {rule} (value not shown)"


def _clipped(error: str) -> str:
    if len(error) <= MAX_ERROR_CHARS:
        return error
    tail = f"... ({len(error)} characters in all)"
    return error[: MAX_ERROR_CHARS - len(tail)] + tail


MAX_DEPTH = 64
"""How deeply arguments may nest. Deeper documents are refused before anything hashes, stores or
evaluates them (each of those walks them recursively, and the store's serializer stops near 250)."""

_MAX_PATH = 8


def unrecordable(arguments: Mapping[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """Where `arguments` are not JSON that Writ can hash and record, and a copy that can be recorded.

    Python's JSON parser (which the 2026-07-28 transport uses) accepts `NaN`, `Infinity` and
    `-Infinity` (and reads `1e400` as infinity) and lone surrogate escapes such as `"\\ud800"`; none of
    them is JSON (RFC 8259) or can be hashed or stored. Such arguments are refused as invalid, and the
    refusal records the copy, where each offending value is replaced by a readable stand-in. Errors
    come as `path: message`, like schema errors (at most ten); empty (and an unchanged copy) if fine.
    """
    errors: list[str] = []

    def where(path: list[str]) -> str:
        shown = [part if len(part) <= 64 else part[:61] + "..." for part in path[:_MAX_PATH]]
        return "/".join(shown + ["..."] * (len(path) > _MAX_PATH)) or "(arguments)"

    def text(value: str, path: list[str], what: str) -> str:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            errors.append(f"{where(path)}: {what} holds a lone surrogate (U+D800 to U+DFFF), not Unicode")
            return _escaped(value)
        return value

    def walk(value: Any, path: list[str]) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            name = "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
            errors.append(f"{where(path)}: {name} is not a JSON number")
            return f"<not JSON: {name}>"
        if isinstance(value, str):
            return text(value, path, "the string")
        if isinstance(value, Mapping | list):
            if len(path) >= MAX_DEPTH:
                errors.append(f"{where(path)}: nested deeper than {MAX_DEPTH} levels")
                return f"<nested deeper than {MAX_DEPTH} levels>"
            if isinstance(value, list):
                return [walk(item, [*path, str(i)]) for i, item in enumerate(value)]
            copy: dict[str, Any] = {}
            for key, item in value.items():
                name = text(key, [*path, _escaped(key)], "the key") if isinstance(key, str) else str(key)
                copy[name] = walk(item, [*path, name])
            return copy
        return value

    copy = walk(dict(arguments), [])
    return errors[:MAX_ERRORS], copy


def _escaped(value: str) -> str:
    """`value` with each lone surrogate spelled as its escape (`\\ud800`), so it can be encoded."""
    return value.encode("utf-8", "backslashreplace").decode("utf-8")


MAX_ARGUMENT_BYTES = 256 * 1024
"""The default of `server.max_argument_bytes`: how large a call's arguments may be, as compact JSON."""


def oversized(arguments: Mapping[str, Any], limit: int) -> str | None:
    """An error naming the size and the limit if `arguments` (as `unrecordable` copied them) exceed it.

    Everything a call's arguments go through (hash, schema, policy, the log, a held copy for an
    approver) grows with them; the MCP SDK alone would let 4 MiB through.
    """
    text = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"), default=str)
    size = len(text.encode("utf-8", "backslashreplace"))
    if size <= limit:
        return None
    return f"(arguments): {size} bytes of JSON, over the limit of {limit} bytes"
