"""Action hashes, derived keys and redaction: the identities that bind keys and approvals to effects."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from capabilities.contract import Capability
from gateway.actions import Redactor, action_hash, canonical_json, derived_key, new_id
from policy.model import Principal

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
    assert "4111" not in stored["card"] and stored["card"].startswith("redacted:hmac-sha256:")
    assert (
        Redactor.from_file(tmp_path / "salt").redact(cap, {"card": "4111 1111 1111 1111"})["card"]
        == stored["card"]
    )
    assert Redactor(b"other salt").redact(cap, {"card": "4111 1111 1111 1111"})["card"] != stored["card"]


def test_new_ids_are_prefixed_and_unique() -> None:
    ids = {new_id("tc") for _ in range(1000)}
    assert len(ids) == 1000 and all(i.startswith("tc_") for i in ids)
