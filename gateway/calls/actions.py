"""Identities of actions: canonical JSON, the action hash, derived idempotency keys, redaction, ids.

The action hash binds an approval or an idempotency key to the exact effect: capability and version,
the hash of the capability's contract, the full canonical arguments (redacted fields included), tenant
and requester.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Generic, TypeVar

from capabilities.contract import Capability
from gateway.errors import ConfigurationError
from gateway.secret_files import create_once
from policy.model import Principal
from store.canonical import canonical_json, legacy_json

DIGEST_PREFIX = "redacted:hmac-sha256:"
MIN_ECHO_CHARS = 4
"""A shorter redacted string is withheld only where a whole string equals it: inside longer text it
would match by chance (and withholding it would garble the rest)."""

__all__ = [
    "PerCapability",
    "Redactor",
    "action_hash",
    "canonical_json",
    "contract_hash",
    "derived_key",
    "new_id",
]

Spelling = Callable[[Any], str]
_V = TypeVar("_V")
SPELLINGS: tuple[Spelling, ...] = (canonical_json, legacy_json)
"""Every JSON spelling a stored hash may have been computed over: RFC 8785 now, `legacy_json` before.

A hash is checked against the spelling it was computed with: an approval granted before the change
still binds its call (a float such as `timeout_s: 30.0` is spelled `30` now, `30.0` then, so every
contract hash, and every action hash with it, differs between the two).
"""


class PerCapability(Generic[_V]):
    """Values computed once per capability object (a `Capability` is immutable, but not hashable: its
    schema is a mapping), so that a call does not redo the canonical JSON of its capability's schema.

    Keyed by identity and holding the capability, so an id is never reused while its entry lives;
    a rediscovered capability is a new object and gets a new entry. Bounded: cleared when full.
    """

    def __init__(self, compute: Callable[[Capability], _V], *, limit: int = 4096) -> None:
        self._compute = compute
        self._limit = limit
        self._values: dict[int, tuple[Capability, _V]] = {}

    def __call__(self, capability: Capability) -> _V:
        entry = self._values.get(id(capability))
        if entry is not None and entry[0] is capability:
            return entry[1]
        value = self._compute(capability)
        if len(self._values) >= self._limit:
            self._values.clear()
        self._values[id(capability)] = (capability, value)
        return value


def contract_hash(capability: Capability, *, spelling: Spelling = canonical_json) -> str:
    """sha256 over what the capability does with a call: everything but its labels."""
    if spelling is canonical_json:
        return _contract_hashes(capability)
    return _contract_hash(capability, spelling)


def _contract_hash(capability: Capability, spelling: Spelling) -> str:
    body = spelling(
        {
            "id": capability.id,
            "version": capability.version,
            "tool_name": capability.tool_name,
            "backend": capability.backend,
            "input_schema": capability.input_schema,
            "output_schema": capability.output_schema,
            "effect": capability.effect,
            "dedupes_on_key": capability.dedupes_on_key,
            "dedupe_window_s": capability.dedupe_window_s,
            "timeout_s": capability.timeout_s,
            "redact": sorted(capability.redact),
            "reconcilable": capability.reconcilable,
            "definition": capability.definition,
        }
    )
    return "sha256:" + hashlib.sha256(body.encode()).hexdigest()


_contract_hashes: PerCapability[str] = PerCapability(
    lambda capability: _contract_hash(capability, canonical_json)
)


def action_hash(
    capability: Capability,
    arguments: Mapping[str, Any],
    principal: Principal,
    *,
    spelling: Spelling = canonical_json,
) -> str:
    """sha256 over what makes two calls the same effect."""
    # The contract joined the hash after events were recorded without it. Old events stay verifiable:
    # each stores the action hash itself and the audit chain covers that stored value, never a
    # recomputation. What changes is what a new hash binds: an approval (or a derived key) given under
    # one contract does not match the same arguments under another, whatever the version says.
    body = spelling(
        {
            "capability": capability.id,
            "version": capability.version,
            "contract": contract_hash(capability, spelling=spelling),
            "arguments": _numbers_by_value(arguments),
            "tenant": principal.tenant,
            "requester": principal.subject,
        }
    )
    return "sha256:" + hashlib.sha256(body.encode()).hexdigest()


def is_contract_hash(stored: str, capability: Capability) -> bool:
    """Whether `stored` is the contract hash of `capability`, in whichever spelling it was taken."""
    return any(stored == contract_hash(capability, spelling=spelling) for spelling in SPELLINGS)


def is_action_hash(
    stored: str, capability: Capability, arguments: Mapping[str, Any], principal: Principal
) -> bool:
    """Whether `stored` is the action hash of this call, in whichever spelling it was taken."""
    return any(
        stored == action_hash(capability, arguments, principal, spelling=spelling) for spelling in SPELLINGS
    )


def _numbers_by_value(value: Any) -> Any:
    # 20 and 20.0 are one JSON number (and one amount to the backend); a client that re-sends a call
    # serialized the other way must join the first one, not get a second effect under a new derived
    # key (or idempotency_conflict under its own). Integral floats hash as the integer they equal.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, Mapping):
        return {key: _numbers_by_value(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_numbers_by_value(item) for item in value]
    return value


def derived_key(principal: Principal, action: str, run_id: str | None) -> str:
    """The idempotency key of a call whose client sent none: same principal, action and run, same key."""
    body = canonical_json([principal.tenant, principal.subject, action, run_id or ""])
    return "derived:" + hashlib.sha256(body.encode()).hexdigest()[:40]


def new_id(prefix: str) -> str:
    """A time-ordered, unguessable id such as `tc_0193a8f2c1d4_9f2b...`."""
    return f"{prefix}_{int(time.time() * 1000):012x}{secrets.token_hex(8)}"


MIN_SALT_BYTES = 16


class Redactor:
    """Replaces the values of a capability's `redact` fields by salted hashes before they are stored."""

    def __init__(self, salt: bytes) -> None:
        self._salt = salt

    @classmethod
    def from_file(cls, path: str | Path) -> Redactor:
        """Load the salt (hex), creating a random one (mode 0600) on first use.

        Raises:
            ConfigurationError: the file holds no salt: not hex, or under 16 bytes.
        """
        path = Path(path)
        if not path.exists():
            create_once(path, secrets.token_hex(32), what="redaction salt")
        text = path.read_text().strip()
        try:
            salt = bytes.fromhex(text)
        except ValueError:
            salt = b""
        if len(salt) < MIN_SALT_BYTES:
            raise ConfigurationError(
                f"privacy.salt_file {path} holds no salt: it needs at least {MIN_SALT_BYTES} bytes as hex "
                "(e.g. `openssl rand -hex 32`); every replica must share the same file"
            )
        return cls(salt)

    def redact(self, capability: Capability, arguments: Mapping[str, Any]) -> dict[str, Any]:
        if not capability.redact:
            return dict(arguments)
        return {
            name: (self.digest(value) if name in capability.redact else value)
            for name, value in arguments.items()
        }

    def withhold_echoes(self, capability: Capability, arguments: Mapping[str, Any], data: Any) -> Any:
        """`data` (JSON: a result, an error's detail, evidence) with every echo of a redacted value withheld.

        A backend that repeats a redacted argument (a card number in its receipt, the reason in its record)
        would put it into the log in clear, where the hash chain keeps it for good. `arguments` are the
        call's as sent (values: withheld wherever they stand inside a string or key) or as stored (salted
        digests: withheld wherever a whole string or number hashes to one, also inside JSON quoted as
        text), each as `[redacted:FIELD]`.
        """
        values: list[tuple[str, Any]] = []
        digests: dict[str, str] = {}
        for name in capability.redact:
            if name not in arguments:
                continue
            value = arguments[name]
            if isinstance(value, str) and value.startswith(DIGEST_PREFIX):
                digests[value] = name
            else:
                values.append((name, value))
        if not values and not digests:
            return data
        return _withheld(data, values, digests, self.digest)

    def digest(self, value: Any) -> str:
        mac = hmac.new(self._salt, canonical_json(value).encode(), hashlib.sha256).hexdigest()
        return f"{DIGEST_PREFIX}{mac[:32]}"


def _withheld(
    data: Any, values: list[tuple[str, Any]], digests: Mapping[str, str], digest: Callable[[Any], str]
) -> Any:
    def marker(name: str) -> str:
        return f"[redacted:{name}]"

    def text(leaf: str) -> str:
        for name, value in values:
            if leaf == value:
                return marker(name)
            if isinstance(value, str) and len(value) >= MIN_ECHO_CHARS:
                # As it stands, and as JSON text inside a string spells it (quotes, backslashes, \u).
                for form in {value, json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1]}:
                    leaf = leaf.replace(form, marker(name))
        if digests and (field := digests.get(digest(leaf))) is not None:
            return marker(field)
        if digests and leaf[:1] in ("{", "["):
            # A body quoted as text (an MCP text block, an HTTP body): its values are leaves too. Spelled
            # anew only where something in it was withheld.
            try:
                parsed = json.loads(leaf)
            except ValueError:
                return leaf
            walked = walk(parsed)
            return leaf if walked == parsed else json.dumps(walked, ensure_ascii=False)
        return leaf

    def walk(node: Any) -> Any:
        if isinstance(node, str):
            return text(node)
        if isinstance(node, dict):
            return {text(key): walk(item) for key, item in node.items()}
        if isinstance(node, list):
            return [walk(item) for item in node]
        if isinstance(node, bool) or node is None:
            return node
        for name, value in values:
            if not isinstance(value, (bool, str)) and node == value:
                return marker(name)
        if digests and (field := digests.get(digest(node))) is not None:
            return marker(field)
        return node

    return walk(data)
