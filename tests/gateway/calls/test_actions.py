"""Action hashes, derived keys and redaction: the identities that bind keys and approvals to effects."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from mcp import types as mcp_types

from capabilities.config import McpBackend, parse_config
from capabilities.contract import Capability
from capabilities.mcp_tools import capabilities_from_tools
from capabilities.registry import Registry
from gateway.calls.actions import (
    Redactor,
    action_hash,
    canonical_json,
    contract_hash,
    derived_key,
    is_action_hash,
    is_contract_hash,
    new_id,
)
from policy.model import Principal
from store.canonical import legacy_json
from store.schema import call_id_bytes, call_id_text

CAP = Capability(id="refund-order", version="2", tool_name="refund_order", backend="acme", input_schema={})
ALICE = Principal(subject="alice", tenant="acme")

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
arguments = st.dictionaries(st.text(min_size=1, max_size=6), json_values, max_size=5)


@given(arguments)
def test_the_action_hash_ignores_key_order(args: dict) -> None:
    reordered = dict(reversed(list(args.items())))
    assert action_hash(CAP, args, ALICE) == action_hash(CAP, reordered, ALICE)


@given(arguments, arguments)
def test_different_arguments_give_different_action_hashes(a: dict, b: dict) -> None:
    if canonical_json(a) != canonical_json(b):
        assert action_hash(CAP, a, ALICE) != action_hash(CAP, b, ALICE)


def floats_for_ints(value: object) -> object:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2**53:
        return float(value)
    if isinstance(value, dict):
        return {k: floats_for_ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [floats_for_ints(v) for v in value]
    return value


@given(arguments)
def test_a_number_written_as_an_integer_or_as_a_float_is_the_same_action(args: dict) -> None:
    # A client re-sending `"amount": 20.0` for `20` joins the first call instead of refunding twice.
    assert action_hash(CAP, args, ALICE) == action_hash(CAP, floats_for_ints(args), ALICE)
    assert action_hash(CAP, {"amount": 20.5}, ALICE) != action_hash(CAP, {"amount": 20}, ALICE)
    assert action_hash(CAP, {"flag": True}, ALICE) != action_hash(CAP, {"flag": 1}, ALICE)


def test_the_action_hash_covers_capability_version_tenant_and_requester() -> None:
    args = {"order_id": "1001", "amount": 20}
    base = action_hash(CAP, args, ALICE)
    other_version = Capability(
        id="refund-order", version="3", tool_name="refund_order", backend="acme", input_schema={}
    )
    assert action_hash(other_version, args, ALICE) != base
    assert action_hash(CAP, args, Principal(subject="alice", tenant="other")) != base
    assert action_hash(CAP, args, Principal(subject="bob", tenant="acme")) != base


def test_hashes_are_taken_over_rfc8785_json_so_a_float_in_the_contract_is_spelled_as_jcs_does() -> None:
    # timeout_s is a float: 30.0 before, 30 in RFC 8785. Every contract hash, and so every action
    # hash, changed with the spelling; derived keys and run ids (strings only) did not.
    args = {"order_id": "1001", "amount": 20.5}
    assert contract_hash(CAP) != contract_hash(CAP, spelling=legacy_json)
    assert action_hash(CAP, args, ALICE) != action_hash(CAP, args, ALICE, spelling=legacy_json)


def test_a_hash_taken_in_the_earlier_spelling_still_binds_the_same_call_and_no_other() -> None:
    # An approval granted before the change is checked against the spelling its hash was taken in.
    args = {"order_id": "1001", "amount": 20.5}
    legacy_action = action_hash(CAP, args, ALICE, spelling=legacy_json)
    legacy_contract = contract_hash(CAP, spelling=legacy_json)
    changed = replace(CAP, timeout_s=31.0)

    assert is_action_hash(legacy_action, CAP, args, ALICE)
    assert is_action_hash(action_hash(CAP, args, ALICE), CAP, args, ALICE)
    assert not is_action_hash(legacy_action, CAP, {**args, "amount": 20.25}, ALICE)
    assert not is_action_hash(legacy_action, changed, args, ALICE)
    assert is_contract_hash(legacy_contract, CAP) and is_contract_hash(contract_hash(CAP), CAP)
    assert not is_contract_hash(legacy_contract, changed)


def test_derived_keys_are_stable_per_run_and_differ_across_runs() -> None:
    h = action_hash(CAP, {"a": 1}, ALICE)
    assert derived_key(ALICE, h, None) == derived_key(ALICE, h, None)
    assert derived_key(ALICE, h, "run-1") != derived_key(ALICE, h, "run-2")
    assert derived_key(ALICE, h, None).startswith("derived:")


def test_redacted_fields_are_stored_as_salted_hashes_and_the_salt_persists(tmp_path: Path) -> None:
    cap = Capability(id="pay", version="1", tool_name="pay", backend="b", input_schema={}, redact=("card",))
    redactor = Redactor.from_file(tmp_path / "salt")
    stored = redactor.redact(cap, {"card": "4111 1111 1111 1111", "amount": 5})
    assert stored["amount"] == 5
    assert "4111 1111" not in stored["card"] and stored["card"].startswith("redacted:hmac-sha256:")
    assert (
        Redactor.from_file(tmp_path / "salt").redact(cap, {"card": "4111 1111 1111 1111"})["card"]
        == stored["card"]
    )
    assert Redactor(b"other salt").redact(cap, {"card": "4111 1111 1111 1111"})["card"] != stored["card"]


PAY = Capability(id="pay", version="1", tool_name="pay", backend="b", input_schema={}, redact=("card", "pin"))
CARD = "4111 1111 1111 1111"


def test_an_echo_of_a_redacted_value_is_withheld_wherever_it_stands_in_a_string_or_key() -> None:
    sent = {"card": CARD, "pin": 1234, "amount": 5}
    result = {
        "content": [{"type": "text", "text": f'{{"card": "{CARD}", "ok": true}}'}],
        "receipt": {"card": CARD, "amount": 5, "pin": 1234, CARD: "as a key"},
        "note": "charged card 4111 1111 1111 1111 today",
    }

    withheld = Redactor(b"salt").withhold_echoes(PAY, sent, result)

    assert CARD not in canonical_json(withheld)
    assert withheld["receipt"] == {
        "card": "[redacted:card]",
        "amount": 5,  # not redacted, though equal to nothing secret
        "pin": "[redacted:pin]",
        "[redacted:card]": "as a key",
    }
    assert withheld["note"] == "charged card [redacted:card] today"
    assert withheld["content"][0]["text"] == '{"card": "[redacted:card]", "ok": true}'


def test_an_echo_spelled_as_json_text_spells_is_withheld_too() -> None:
    quoted = 'he said "refund" \\ now'
    cap = replace(PAY, redact=("reason",))
    text = canonical_json({"reason": quoted})  # as a backend's JSON body quotes it inside a text block

    withheld = Redactor(b"salt").withhold_echoes(cap, {"reason": quoted}, {"text": text})

    assert withheld == {"text": '{"reason":"[redacted:reason]"}'}


def test_a_short_redacted_value_is_withheld_only_where_a_whole_string_is_it() -> None:
    cap = replace(PAY, redact=("code",))
    withheld = Redactor(b"salt").withhold_echoes(cap, {"code": "ab"}, {"code": "ab", "text": "about tabs"})
    assert withheld == {"code": "[redacted:code]", "text": "about tabs"}


def test_an_echo_is_withheld_by_its_digest_where_only_the_stored_arguments_are_known() -> None:
    redactor = Redactor(b"salt")
    stored = redactor.redact(PAY, {"card": CARD, "pin": 1234, "amount": 5})

    withheld = redactor.withhold_echoes(PAY, stored, {"card": CARD, "pin": 1234, "amount": 5, "x": [CARD]})

    assert withheld == {
        "card": "[redacted:card]",
        "pin": "[redacted:pin]",
        "amount": 5,
        "x": ["[redacted:card]"],
    }


def test_without_redacted_fields_nothing_is_touched() -> None:
    data = {"card": CARD}
    assert Redactor(b"salt").withhold_echoes(CAP, {"card": CARD}, data) is data


def test_new_ids_are_prefixed_and_unique() -> None:
    ids = {new_id("tc") for _ in range(1000)}
    assert len(ids) == 1000 and all(i.startswith("tc_") for i in ids)


def test_the_ids_the_gateway_mints_take_the_stores_compact_form() -> None:
    # store.schema.CallId keeps `<prefix>_<28 hex digits>` in 17 bytes (migration 0022); an id of
    # another form would be stored, and read back, as its 31 characters.
    for _ in range(100):
        tool_call_id = new_id("tc")
        assert len(call_id_bytes(tool_call_id) or b"") == 17
        assert call_id_text(call_id_bytes(tool_call_id) or b"") == tool_call_id


def test_the_action_hash_covers_the_contract_so_a_changed_contract_under_one_version_is_another_action() -> (
    None
):
    changed = replace(CAP, input_schema={"type": "object", "properties": {"amount": {"maximum": 10}}})

    assert changed.ref == CAP.ref
    assert action_hash(changed, {"amount": 5}, ALICE) != action_hash(CAP, {"amount": 5}, ALICE)


def configured(**changes: Any) -> Capability:
    """The refund as a configuration builds it, with `changes` made to its capability or its backend."""
    backend = {"type": "http", "base_url": "http://acme.test", "headers": {"X-Key": "literal-secret"}}
    capability: dict[str, Any] = {
        "id": "refund-order",
        "version": "2",
        "tool": "refund_order",
        "backend": "acme",
        "effect": "write",
        "description": "Refund an order.",
        "input_schema": {"type": "object", "properties": {"amount": {"type": "number"}}},
        "request": {"method": "POST", "path": "/refunds"},
        "idempotency_header": "Idempotency-Key",
    }
    for name, value in changes.items():
        target = backend if name in ("base_url", "headers") else capability
        target[name] = value
    built = Registry.from_config(parse_config({"acme": backend}, [capability])).get("refund_order")
    assert built is not None
    return built


def test_each_part_of_a_configured_contract_changes_its_hash_and_its_labels_do_not() -> None:
    base = contract_hash(configured())
    changed = {
        "request": {"method": "POST", "path": "/refunds/v2"},
        "base_url": "http://payments.test",
        "idempotency_header": "X-Request-Key",
        "dedupes_on_key": True,
        "effect": "irreversible",
        "input_schema": {"type": "object", "properties": {"amount": {"type": "integer"}}},
        "headers": {"X-Other": "literal-secret"},
    }
    for name, value in changed.items():
        assert contract_hash(configured(**{name: value})) != base, name
    for label in ({"description": "Give money back."}, {"title": "Refund"}, {"summary": "refund {amount}"}):
        assert contract_hash(configured(**label)) == base, label
    # A literal header's value is no part of it: the contract hash is logged, the header may be a secret.
    assert contract_hash(configured(headers={"X-Key": "another-secret"})) == base
    assert "literal-secret" not in canonical_json(configured().definition)


def test_a_lookup_declaring_how_its_answer_is_read_is_another_contract_and_one_declaring_nothing_is_not() -> (
    None
):
    lookup = {"method": "GET", "path": "/refunds?idempotency_key={idempotency_key}"}
    undeclared = configured(reconcile=lookup)

    # The contract as it was before lookups could declare anything: an upgrade changes no derived key,
    # so a re-send still joins a call left of unknown outcome.
    assert undeclared.definition["capability"]["reconcile"] == {**lookup, "method": "GET"}
    assert contract_hash(configured(reconcile={**lookup, "records": "/refunds"})) != contract_hash(undeclared)
    outcome = {"field": "/status", "succeeded": ["succeeded"]}
    declared = configured(reconcile={**lookup, "records": "/refunds", "outcome": outcome})
    assert declared.definition["capability"]["reconcile"]["outcome"] == {**outcome, "failed": []}


def upstream_refund(backend: dict[str, Any]) -> Capability:
    """The refund an upstream MCP server lists, as a backend configured by `backend` exposes it."""
    tools = [
        mcp_types.Tool(name="refund", input_schema={"type": "object", "properties": {"amount": {}}}),
        mcp_types.Tool(name="find", input_schema={"type": "object"}),
    ]
    return capabilities_from_tools("pay", McpBackend.model_validate({"type": "mcp", **backend}), tools)[0]


def test_an_upstream_tool_leaving_tool_errors_undeclared_keeps_the_contract_it_had_before() -> None:
    # Hashes taken with the code before `tool_errors` existed (4a0c727). Had the setting's absence
    # changed them, every MCP tool's derived keys would change on upgrade, and the re-send of a call
    # left of unknown outcome across it would reach the backend as a new effect.
    plain = {"url": "http://upstream.test/mcp"}
    lookup = {"tool": "find", "arguments": {"key": "{idempotency_key}"}}
    with_lookup = {**plain, "defaults": {"effect": "write"}, "overrides": {"refund": {"reconcile": lookup}}}

    assert contract_hash(upstream_refund(plain)) == (
        "sha256:9f3579130d7a66733f5710fe5c4aaaaa63894a80ecaad97a4d968c065bfe699a"
    )
    assert contract_hash(upstream_refund(with_lookup)) == (
        "sha256:0aecd2acbbff195d451e4902ddad3123ef023e941c58cc290943728e32b9006f"
    )
    for declared in (
        {**plain, "defaults": {"tool_errors": "before_effect"}},
        {**plain, "overrides": {"refund": {"tool_errors": "may_follow_effect"}}},
    ):
        assert contract_hash(upstream_refund(declared)) != contract_hash(upstream_refund(plain)), declared
