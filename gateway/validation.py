"""Arguments against a capability's input schema: checked once at startup, applied on every call."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from capabilities.contract import Capability
from gateway.errors import ConfigurationError

MAX_ERRORS = 10


class InputSchemas:
    """Compiled validators, one per capability version, built once and reused."""

    def __init__(self) -> None:
        self._validators: dict[str, Draft202012Validator] = {}

    def check(self, capability: Capability) -> Draft202012Validator:
        """The validator for `capability`.

        Raises:
            ConfigurationError: its input schema is not a valid JSON Schema.
        """
        validator = self._validators.get(capability.ref)
        if validator is None:
            try:
                Draft202012Validator.check_schema(dict(capability.input_schema))
            except SchemaError as exc:
                raise ConfigurationError(f"{capability.ref}: invalid input schema: {exc.message}") from exc
            validator = Draft202012Validator(dict(capability.input_schema))
            self._validators[capability.ref] = validator
        return validator

    def errors(self, capability: Capability, arguments: Mapping[str, Any]) -> list[str]:
        """Every way `arguments` break the schema (at most ten), as `path: message`; empty if valid."""
        found = sorted(self.check(capability).iter_errors(arguments), key=lambda e: list(e.path))
        return [f"{'/'.join(map(str, e.path)) or '(arguments)'}: {e.message}" for e in found[:MAX_ERRORS]]
